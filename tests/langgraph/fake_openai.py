"""A fake OpenAI-compatible endpoint (httpx ``MockTransport``) that records request bodies
and headers.

It answers ``/v1/chat/completions`` in the OpenAI format, streaming (SSE) or not: with a
tool call when tools are offered and the conversation does not end with a tool result,
else with ``"answer: <first user message>"``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx


class FakeOpenAI:
    """Records every request body; serves chat completions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self.transport = httpx.MockTransport(self._handle)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._bodies)

    @property
    def headers(self) -> list[dict[str, str]]:
        """The headers of each request, lower-case names, in the order of ``bodies``."""
        with self._lock:
            return list(self._headers)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        with self._lock:
            self._bodies.append(body)
            self._headers.append({k.lower(): v for k, v in request.headers.items()})
        message = self._answer(body)
        if body.get("stream"):
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                content=self._sse(body, message).encode(),
            )
        return httpx.Response(
            200,
            json={
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    @staticmethod
    def _answer(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        first_user = next(str(m["content"]) for m in messages if m["role"] == "user")
        if body.get("tools") and messages[-1]["role"] != "tool":
            tool = body["tools"][0]["function"]["name"]
            call = {
                "id": f"call-{len(messages)}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"query": first_user})},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": f"answer: {first_user}"}

    @staticmethod
    def _sse(body: dict[str, Any], message: dict[str, Any]) -> str:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            data = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(data)}\n\n"

        out = [chunk({"role": "assistant", "content": ""})]
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            out.append(chunk({"tool_calls": [{"index": 0, **call}]}))
            out.append(chunk({}, "tool_calls"))
        else:
            for word in str(message["content"]).split(" "):
                out.append(chunk({"content": word + " "}))
            out.append(chunk({}, "stop"))
        return "".join(out) + "data: [DONE]\n\n"
