"""Fake chat models for the adapter tests: scripted, thread-safe, tool-capable.

``ScriptedChatModel`` answers with ``script(messages, tools)``, a pure function of its
input, so concurrent runs get deterministic outputs. Every call records the structure
tags visible in the ContextVar *inside* the model call (what a request layer would send).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from agentspec_mw.tags import StructureTags
from agentspec_mw_langgraph import current_tags

Script = Callable[[list[BaseMessage], list[dict[str, Any]]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """Answers ``script(messages, tools)``; records ``(tags, last message text)`` per call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: Script
    model: str = "fake-model"
    _seen: list[tuple[StructureTags | None, str]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted-fake"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model}

    @property
    def seen(self) -> list[tuple[StructureTags | None, str]]:
        with self._lock:
            return list(self._seen)

    def _answer(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> AIMessage:
        with self._lock:
            self._seen.append((current_tags(), str(messages[-1].content) if messages else ""))
        return self.script(messages, list(kwargs.get("tools") or []))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages, kwargs))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        answer = self._answer(messages, kwargs)
        words = str(answer.content).split(" ") if answer.content else []
        for i, word in enumerate(words):
            yield ChatGenerationChunk(message=AIMessageChunk(content=(" " if i else "") + word))
        if answer.tool_calls:
            chunks = [
                {
                    "name": c["name"],
                    "args": json.dumps(c["args"]),
                    "id": c["id"],
                    "index": j,
                }
                for j, c in enumerate(answer.tool_calls)
            ]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=chunks))

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[Any, AIMessage]:
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """An AI message that calls one tool."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])
