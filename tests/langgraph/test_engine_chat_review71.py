"""Session 71's review of ``ChatAgentSpecVLLM`` streaming: the model's own final chunk is
marked ``chunk_position="last"``, so LangChain (1.x) appends no empty chunk after it and
the last chunk of ``stream`` / ``astream`` / a graph's ``stream_mode="messages"`` carries
the speculation stats, ``finish_reason``, the usage and the tool call chunks, as the docs
say. Each test failed before the fix (the last chunk was LangChain's empty one)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import tool

from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.backend import GenerationRequest, GenerationResult
from agentspec_mw_langgraph.engine_chat import _DeltaChunker

from .fake_engine import FakeBackend, FakeStreamingBackend

STATS = {"num_draft_tokens": 10, "num_accepted_draft_tokens": 7}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class _Speculating(FakeBackend):
    """Results with speculation stats (as a speculating vLLM engine reports them)."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [
            dataclasses.replace(r, num_draft_tokens=10, num_accepted_draft_tokens=7)
            for r in super().generate(requests)
        ]


class _SpeculatingStreaming(_Speculating, FakeStreamingBackend):
    pass


class _StopString(FakeBackend):
    """Ends on one of the request's stop strings, as vLLM does: the text is cut before it
    (streamed deltas never hold it), ``finish_reason`` ``"stop"``, no stats."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out = []
        for request, result in zip(requests, super().generate(requests), strict=True):
            text = result.text
            for stop in request.stop:
                text = text.split(stop)[0]
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            out.append(dataclasses.replace(result, text=text, token_ids=ids))
        return out


class _StopStringStreaming(_StopString, FakeStreamingBackend):
    pass


_PLAIN = "Hello there, friend. How are you today?"
_TOOL = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
_INVALID = 'Let me compute.\n<tool_call>\n{"name": "add", "arguments": "2+3"}\n</tool_call>'
_TWO = _TOOL + '\n<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>'

_BACKENDS = [_Speculating, _SpeculatingStreaming]
_TEXTS = {"plain": _PLAIN, "tool": _TOOL, "invalid": _INVALID, "valid+invalid": _TWO, "empty": ""}


def _model(backend_cls: type[FakeBackend], tokenizer: Any, text: str, **kw: Any) -> Any:
    model = ChatAgentSpecVLLM(engine=backend_cls(tokenizer, lambda prompt: text), **kw)
    return model.bind_tools([add])


def _join(chunks: list[BaseMessage]) -> AIMessageChunk:
    joined: Any = None
    for chunk in chunks:
        joined = chunk if joined is None else joined + chunk
    assert isinstance(joined, AIMessageChunk)
    return joined


def _check_last(chunks: list[BaseMessage], invoked: AIMessage, stats: bool = True) -> None:
    """The last chunk is the model's own, marked last, with the call's metadata; it is the
    only one marked last; the chunks join to the ``invoke`` message."""
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    last = chunks[-1]
    assert isinstance(last, AIMessageChunk)
    assert [c.chunk_position for c in chunks].count("last") == 1  # type: ignore[attr-defined]
    assert last.chunk_position == "last"
    meta = last.response_metadata
    assert meta["finish_reason"] == invoked.response_metadata["finish_reason"] == "stop"
    if stats:
        assert meta["speculative_decoding"] == STATS
    else:
        assert "speculative_decoding" not in meta
    assert last.usage_metadata == invoked.usage_metadata
    n_calls = len(invoked.tool_calls) + len(invoked.invalid_tool_calls)
    assert len(last.tool_call_chunks) == n_calls
    # no other chunk carries metadata, calls or usage
    for chunk in chunks[:-1]:
        assert isinstance(chunk, AIMessageChunk)
        assert not chunk.response_metadata.get("finish_reason")
        assert not chunk.tool_call_chunks and chunk.usage_metadata is None
    joined = _join(chunks)
    assert joined.content == invoked.content
    assert joined.tool_calls == invoked.tool_calls
    strip = [{k: v for k, v in c.items() if k != "error"} for c in invoked.invalid_tool_calls]
    assert [{k: v for k, v in c.items() if k != "error"} for c in joined.invalid_tool_calls] == (
        strip
    )
    assert joined.usage_metadata == invoked.usage_metadata
    for key in ("finish_reason", "model_name", "speculative_decoding"):
        assert joined.response_metadata.get(key) == invoked.response_metadata.get(key)


@pytest.mark.parametrize("backend_cls", _BACKENDS)
@pytest.mark.parametrize("text", list(_TEXTS.values()), ids=list(_TEXTS))
def test_the_last_chunk_of_a_stream_carries_the_calls_metadata(
    tiny_tokenizer: Any, backend_cls: type[FakeBackend], text: str
) -> None:
    model = _model(backend_cls, tiny_tokenizer, text)
    invoked = model.invoke("hi")
    assert invoked.response_metadata["speculative_decoding"] == STATS
    _check_last(list(model.stream("hi")), invoked)

    async def run() -> list[BaseMessage]:
        return [c async for c in model.astream("hi")]

    _check_last(asyncio.run(run()), invoked)
    # streaming=True: invoke goes through the stream and gives the same message
    streamed = _model(backend_cls, tiny_tokenizer, text, streaming=True).invoke("hi")
    assert (streamed.content, streamed.tool_calls) == (invoked.content, invoked.tool_calls)
    assert streamed.response_metadata.get("speculative_decoding") == STATS
    assert streamed.response_metadata["finish_reason"] == "stop"


def test_a_stream_ended_by_a_stop_string_marks_one_last_chunk(tiny_tokenizer: Any) -> None:
    for backend_cls in (_StopString, _StopStringStreaming):
        model = ChatAgentSpecVLLM(
            engine=backend_cls(tiny_tokenizer, lambda prompt: _PLAIN), stop=["."]
        )
        invoked = model.invoke("hi")
        assert invoked.content == "Hello there, friend"
        _check_last(list(model.stream("hi")), invoked, stats=False)


@pytest.mark.parametrize("backend_cls", _BACKENDS)
@pytest.mark.parametrize("text", [_PLAIN, _TOOL], ids=["plain", "tool"])
def test_a_graph_streamed_in_messages_mode_ends_on_the_models_last_chunk(
    tiny_tokenizer: Any, backend_cls: type[FakeBackend], text: str
) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    model = _model(backend_cls, tiny_tokenizer, text)
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    app = graph.compile()
    chunks = [c for c, _ in app.stream({"messages": [("user", "hi")]}, stream_mode="messages")]
    _check_last(chunks, model.invoke("hi"))


def test_nothing_follows_the_final_item(tiny_tokenizer: Any) -> None:
    """A backend that sends more after its ``final`` item: ignored, one last chunk."""
    model = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda p: "x"))
    request = model._request([HumanMessage("hi")], None, {}, None)
    chunker = _DeltaChunker(model, request)
    final = GenerationResult(text="ab", token_ids=(1, 2), finish_reason="stop")
    out = [*chunker.feed("delta", "ab"), *chunker.feed("final", final)]
    out += [*chunker.feed("delta", "cd"), *chunker.feed("final", final)]
    assert [c.message.content for c in out] == ["ab", ""]
    assert [c.message.chunk_position for c in out] == [None, "last"]  # type: ignore[attr-defined]
