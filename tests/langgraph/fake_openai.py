"""A fake OpenAI-compatible endpoint (httpx ``MockTransport``) that records request bodies
and headers.

It answers ``/v1/chat/completions`` in the OpenAI format, streaming (SSE) or not: with a
tool call when tools are offered and the conversation does not end with a tool result,
else with ``"answer: <first user message>"``.

With ``spec_decoding=True`` it also reports per-request speculation stats as a vLLM server
started with ``--per-request-spec-decode-metrics summary`` does (``metrics`` in the body;
when streaming, on a final usage chunk if ``stream_options.include_usage``): the i-th
request (from 0) drafted ``10 * (i + 1)`` tokens and had ``i + 1`` accepted
(:meth:`FakeOpenAI.expected_stats`). ``chunk_bytes`` sends bodies unread, in pieces of
that many bytes (as a network transport does), instead of in one piece.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx


class _Pieces(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body sent in pieces of ``size`` bytes, sync or async."""

    def __init__(self, data: bytes, size: int) -> None:
        self._parts = [data[i : i + size] for i in range(0, len(data), size)]

    def __iter__(self) -> Iterator[bytes]:
        yield from self._parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part


def spec_metrics(index: int) -> dict[str, Any]:
    """vLLM's ``metrics`` of the ``index``-th request (k = 2; the extra fields as vLLM)."""
    drafted, accepted = 10 * (index + 1), index + 1
    steps = drafted // 2
    return {
        "time_to_first_token_ms": 1.0,
        "speculative_decoding": {
            "mean_acceptance_length": 1 + accepted / steps,
            "draft_acceptance_rate": accepted / drafted,
            "acceptance_histogram": [steps - accepted, accepted, 0],
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted,
            "num_spec_tokens": 2,
        },
    }


class FakeOpenAI:
    """Records every request body; serves chat completions."""

    def __init__(self, *, spec_decoding: bool = False, chunk_bytes: int | None = None) -> None:
        self.spec_decoding = spec_decoding
        self.chunk_bytes = chunk_bytes
        self.metrics_override: dict[str, Any] | None = None
        """Sent as ``metrics`` instead of :func:`spec_metrics` (malformed-field tests)."""
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

    @staticmethod
    def expected_stats(index: int) -> dict[str, int]:
        """``response_metadata["speculative_decoding"]`` of the ``index``-th request."""
        spec = spec_metrics(index)["speculative_decoding"]
        return {k: spec[k] for k in ("num_draft_tokens", "num_accepted_draft_tokens")}

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        with self._lock:
            index = len(self._bodies)
            self._bodies.append(body)
            self._headers.append({k.lower(): v for k, v in request.headers.items()})
        message = self._answer(body)
        metrics = None
        if self.spec_decoding:
            metrics = self.metrics_override or spec_metrics(index)
        if body.get("stream"):
            usage = (body.get("stream_options") or {}).get("include_usage")
            sse = self._sse(body, message, metrics if usage else None)
            return self._response("text/event-stream", sse.encode())
        data = {
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
        }
        if metrics is not None:
            data["metrics"] = metrics
        return self._response("application/json", json.dumps(data).encode())

    def _response(self, content_type: str, data: bytes) -> httpx.Response:
        headers = {"content-type": content_type}
        if self.chunk_bytes is None:
            return httpx.Response(200, headers=headers, content=data)
        return httpx.Response(200, headers=headers, stream=_Pieces(data, self.chunk_bytes))

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
    def _sse(body: dict[str, Any], message: dict[str, Any], metrics: Any = None) -> str:
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
        if metrics is not None:  # vLLM: on the usage chunk (choices empty)
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            final = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0}
            final.update(model=body["model"], choices=[], usage=usage, metrics=metrics)
            out.append(f"data: {json.dumps(final)}\n\n")
        return "".join(out) + "data: [DONE]\n\n"
