"""The engine-backed chat model on a fake backend: tags in extra_args, tool calling via the
chat template, streaming, async, create_agent, and request batching."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.tools import tool

from agentspec_mw.tags import tags_from_wire
from agentspec_mw_langgraph import ChatAgentSpecVLLM, TaggingConfig, with_agentspec
from agentspec_mw_langgraph.shared import release_shared_engines
from agentspec_mw_langgraph.toolformat import parse_tool_calls, render_chat_prompt

from .fake_engine import FakeBackend

BLOCKS = (("```", "```"), ("<tool_call>", "</tool_call>"))


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_script(prompt: str) -> str:
    if "<|im_start|>tool" in prompt:
        return "The sum is 5."
    return 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize("streaming", [False, True], ids=["invoke", "stream-messages"])
def test_create_agent_with_engine_model(
    tiny_tokenizer: Any, strict: TaggingConfig, streaming: bool
) -> None:
    from langchain.agents import create_agent

    backend = FakeBackend(tiny_tokenizer, agent_script)
    model = ChatAgentSpecVLLM(engine=backend, max_tokens=32)
    app = with_agentspec(create_agent(model, [add]), config=strict)
    inp = {"messages": [HumanMessage("what is 2+3?")]}
    if streaming:
        items = list(app.stream(inp, stream_mode=["messages", "values"]))
        out = [data for mode, data in items if mode == "values"][-1]
        pieces = [data[0] for mode, data in items if mode == "messages"]
        answer = [p for p in pieces if isinstance(p, AIMessageChunk) and p.content]
        assert len(answer) > 2  # the answer arrived token by token
    else:
        out = app.invoke(inp)
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][1].tool_calls[0]["args"] == {"a": 2, "b": 3}
    assert out["messages"][1].content == "Let me add."
    assert out["messages"][2].content == "5"
    assert out["messages"][-1].content == "The sum is 5."

    (p1, r1), (p2, r2) = backend.requests
    # the template has no tools support: tools offered in a system message, Hermes format
    assert p1.startswith("<|im_start|>system\nYou may call one or more functions")
    assert '"name": "add"' in p1 and p1.endswith("<|im_start|>assistant\n")
    # the earlier call is folded back as the model wrote it; the result keeps the tool role
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in p2
    assert "<|im_start|>tool\n5<|im_end|>" in p2
    t1, t2 = tags_from_wire(r1.extra_args), tags_from_wire(r2.extra_args)
    assert t1 is not None and t2 is not None
    assert (t1.agent_id, t1.segment, t1.blocks) == ("model", "tool_call", BLOCKS)
    assert (t2.agent_id, t2.segment, t2.group_kind) == ("model", "answer", None)
    assert t1.group_id is None and t2.group_id is None  # a repeat keys with its first call
    assert t1.query_id == t2.query_id
    assert (r1.max_tokens, r1.temperature) == (32, 0.0)


def test_plain_call_has_no_tags_and_async_stream(tiny_tokenizer: Any) -> None:
    backend = FakeBackend(tiny_tokenizer, lambda prompt: "hello world, streaming works")
    model = ChatAgentSpecVLLM(engine=backend)
    assert model.invoke("hi").content == "hello world, streaming works"
    assert backend.requests[0][1].extra_args is None

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
            self.tokens.append(token)

    counter = Tokens()
    chunks = list(model.stream("hi", {"callbacks": [counter]}))
    assert len(chunks) > 3
    assert "".join(str(c.content) for c in chunks) == "hello world, streaming works"
    assert "".join(counter.tokens) == "hello world, streaming works"

    async def run() -> tuple[str, str]:
        msg = await model.ainvoke("hi")
        parts = [str(c.content) async for c in model.astream("hi")]
        return str(msg.content), "".join(parts)

    assert asyncio.run(run()) == ("hello world, streaming works",) * 2


def test_streamed_tool_call_aggregates(tiny_tokenizer: Any) -> None:
    model = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, agent_script))
    bound = model.bind_tools([add])
    total = None
    for chunk in bound.stream("add"):
        total = chunk if total is None else total + chunk
    assert total is not None
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [("add", {"a": 2, "b": 3})]  # type: ignore[attr-defined]
    # tool_choice="none" withholds the tools
    model.bind_tools([add], tool_choice="none").invoke("add")
    assert "You may call" not in model.backend.requests[-1][0]  # type: ignore[attr-defined]


def test_parse_tool_calls() -> None:
    content, calls, invalid = parse_tool_calls(
        'ok <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    assert content == "ok"
    assert [(c["name"], c["args"]) for c in calls] == [("f", {"x": 1})]
    assert [i["args"] for i in invalid] == ["not json"]
    assert parse_tool_calls("plain ```code```") == ("plain ```code```", [], [])


def test_render_uses_native_tool_template(tiny_tokenizer: Any) -> None:
    class NativeTemplate:
        chat_template = "{{ tools }} {{ messages }} tool_calls"

        def apply_chat_template(self, msgs: list[Any], **kwargs: Any) -> str:
            return f"native tools={len(kwargs['tools'])} msgs={len(msgs)}"

    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    messages = [{"role": "user", "content": "hi"}]
    assert render_chat_prompt(NativeTemplate(), messages, tools) == "native tools=1 msgs=1"
    assert "<tools>" in render_chat_prompt(tiny_tokenizer, messages, tools)


def test_engine_built_lazily_with_build_llm(
    tiny_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentspec_mw_vllm.engine as engine_mod

    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake_build_llm(model: Any, **kwargs: Any) -> FakeBackend:
        calls.append((model, kwargs))
        return FakeBackend(tiny_tokenizer, lambda prompt: "built")

    monkeypatch.setattr(engine_mod, "build_llm", fake_build_llm)
    model = ChatAgentSpecVLLM(k=4, max_model_len=512, engine_options={"enforce_eager": True})
    try:
        assert model.invoke("hi").content == "built"
        assert model.invoke("again").content == "built"
    finally:
        release_shared_engines()
    assert calls == [
        (
            None,
            {"speculative": "agentspec", "k": 4, "max_model_len": 512, "enforce_eager": True},
        )
    ]


def test_incremental_streaming_backend(tiny_tokenizer: Any, strict: TaggingConfig) -> None:
    from .fake_engine import FakeStreamingBackend

    text = "plain answer, streamed in pieces"
    model = ChatAgentSpecVLLM(engine=FakeStreamingBackend(tiny_tokenizer, lambda p: text))
    pieces = [str(c.content) for c in model.stream("hi")]
    assert "".join(pieces) == text and len(pieces) >= len(text) // 3

    async def run() -> tuple[str, list[str]]:
        msg = await model.ainvoke("hi")
        return str(msg.content), [str(c.content) async for c in model.astream("hi")]

    content, apieces = asyncio.run(run())
    assert content == text and "".join(apieces) == text

    # a tool call: content before the block streams, the "<tool_call>" start never leaks
    tools = ChatAgentSpecVLLM(engine=FakeStreamingBackend(tiny_tokenizer, agent_script))
    chunks = list(tools.bind_tools([add]).stream("add"))
    assert all("<tool" not in str(c.content) for c in chunks)
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.tool_calls == [  # type: ignore[attr-defined]
        {
            "name": "add",
            "args": {"a": 2, "b": 3},
            "id": total.tool_calls[0]["id"],
            "type": "tool_call",
        }  # type: ignore[attr-defined]
    ]
    assert str(total.content).strip() == "Let me add."

    # inside a graph the tags reach the async request
    backend = FakeStreamingBackend(tiny_tokenizer, agent_script)
    from langchain.agents import create_agent

    app = with_agentspec(create_agent(ChatAgentSpecVLLM(engine=backend), [add]), config=strict)

    async def agent_run() -> Any:
        return [c async for c in app.astream({"messages": [HumanMessage("2+3")]})]

    asyncio.run(agent_run())
    tags = [tags_from_wire(r.extra_args) for _, r in backend.requests]
    assert [(t.agent_id, t.segment) for t in tags] == [  # type: ignore[union-attr]
        ("model", "tool_call"),
        ("model", "answer"),
    ]
