"""Faults of the adapters found in review: batched calls, retrievers, streamed text after a
tool call, calls another handler rejected, resumed middleware runs, an unopenable trace
file, a handler given to the model only, and the middleware's ``agent=`` argument."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForLLMRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    ChatAgentSpecVLLM,
    TaggingConfig,
    current_tags,
    get_handler,
    with_agentspec,
)
from agentspec_mw_langgraph import handler as handler_module
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler

from .fake_chat import ScriptedChatModel, tool_call
from .fake_engine import FakeBackend, FakeStreamingBackend

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
AFTER_TOOL: list[BaseMessage] = [
    HumanMessage("q1"),
    AIMessage("", tool_calls=[{"name": "add", "args": {}, "id": "c1"}]),
    ToolMessage("tool-result", tool_call_id="c1"),
]
FRESH: list[BaseMessage] = [HumanMessage("fresh question")]


class CharTokenizer:
    """One token per character; a chat template that keeps each message's text."""

    chat_template = "{{ messages }} tools tool_calls"

    def apply_chat_template(self, msgs: list[dict[str, Any]], **kwargs: Any) -> str:
        return "".join(f"<|{m['role']}|>{m.get('content') or ''}" for m in msgs) + "<|assistant|>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content="ok:" + str(messages[-1].content))


class _S(TypedDict):
    x: str


def _one_node_graph(node: Any, name: str = "worker") -> Any:
    g = StateGraph(_S)
    g.add_node(name, node)
    g.add_edge(START, name)
    g.add_edge(name, END)
    return g.compile()


# ------------------------------------------------------------- 1: generate() batches
@pytest.mark.parametrize("use_async", [False, True], ids=["generate", "agenerate"])
def test_batch_calls_send_their_own_tags(strict: TaggingConfig, use_async: bool) -> None:
    """Each prompt of a batch sends its own call's tags (the engine model, by run id); a
    model that reads the ContextVar sends none rather than another call's."""
    backend = FakeBackend(CharTokenizer(), lambda prompt: "done")
    engine_model = ChatAgentSpecVLLM(engine=backend)
    plain = ScriptedChatModel(script=echo)

    def node(state: _S, config: RunnableConfig) -> _S:
        for model in (engine_model, plain):
            model.generate([AFTER_TOOL, FRESH], tools=TOOLS, callbacks=config["callbacks"])
        return {"x": "done"}

    async def anode(state: _S, config: RunnableConfig) -> _S:
        for model in (engine_model, plain):
            await model.agenerate([AFTER_TOOL, FRESH], tools=TOOLS, callbacks=config["callbacks"])
        return {"x": "done"}

    app = with_agentspec(_one_node_graph(anode if use_async else node), config=strict)
    if use_async:
        asyncio.run(app.ainvoke({"x": ""}))
    else:
        app.invoke({"x": ""})
    sent = {}
    for prompt, request in backend.requests:
        tags = tags_from_wire(request.extra_args)
        assert tags is not None
        sent["tool-result" if prompt.endswith("tool-result<|assistant|>") else "fresh"] = tags
    assert {k: t.segment for k, t in sent.items()} == {
        "tool-result": "answer",
        "fresh": "tool_call",
    }
    assert all(tags is None for tags, _ in plain.seen)  # untagged, not wrongly tagged
    stats = get_handler(app).stats
    assert (stats.llm_calls, stats.tags_derived, stats.tags_delivered) == (4, 4, 2)
    assert get_handler(app).live_state() == {"runs": 0, "roots": 0, "calls": 0}


# ------------------------------------------------------------ 2: retriever runs
def test_llm_call_inside_retriever_joins_the_graph_query(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)

    class RewritingRetriever(BaseRetriever):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
            model.invoke([HumanMessage("rewrite:" + query)], {"callbacks": run_manager.get_child()})
            return [Document(page_content="doc")]

    def researcher(state: _S) -> _S:
        model.invoke([HumanMessage("direct")])
        RewritingRetriever().invoke("q")
        return {"x": "done"}

    app = with_agentspec(_one_node_graph(researcher), config=strict)
    app.invoke({"x": ""})
    (direct, _), (rewrite, _) = model.seen
    assert direct is not None and rewrite is not None
    assert rewrite.query_id == direct.query_id and rewrite.agent_id == "worker"
    assert list(get_handler(app).graphs()) == [direct.query_id]
    assert get_handler(app).live_state() == {"runs": 0, "roots": 0, "calls": 0}

    # a retriever outside any graph run: its calls share its query, its state is released
    handler = AgentSpecCallbackHandler(strict)
    RewritingRetriever().invoke("q", {"callbacks": [handler]})
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


# ------------------------------------------------- 3: streamed text after a tool call
@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize(
    "output",
    [
        CALL + "\nI will then report the sum.",
        "Let me add.\n" + CALL + "\n",
        "Let me add.  \n" + CALL + "\nthen\n" + CALL + "\nreport. ",
        "plain answer with trailing space \n",
        " Let me add. " + CALL,
    ],
    ids=["text-after", "text-before", "two-blocks", "no-call", "edge-spaces"],
)
def test_stream_joins_to_the_invoke_message(output: str) -> None:
    """The streamed chunks join to the ``invoke`` message (edge spaces the parse strips
    from an output with tool calls aside: they were streamed before the block came)."""
    model = ChatAgentSpecVLLM(engine=FakeStreamingBackend(CharTokenizer(), lambda p: output))
    bound = model.bind_tools([add])
    expected = bound.invoke("add 2 and 3")

    async def astream() -> list[Any]:
        return [c async for c in bound.astream("add 2 and 3")]

    for chunks in (list(bound.stream("add 2 and 3")), asyncio.run(astream())):
        assert all("<tool" not in str(c.content) for c in chunks)
        total = chunks[0]
        for chunk in chunks[1:]:
            total = total + chunk
        if output.startswith(" "):
            assert str(total.content).strip() == expected.content
        else:
            assert total.content == expected.content
        assert [c["args"] for c in total.tool_calls] == [c["args"] for c in expected.tool_calls]


# ------------------------------------------- 4: a call another handler rejected
class _BudgetGuard(BaseCallbackHandler):
    raise_error = True

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("token budget exceeded")


def test_rejected_calls_do_not_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    logging.getLogger("langchain_core.callbacks.manager").setLevel(logging.CRITICAL)
    handler = AgentSpecCallbackHandler()
    model = ScriptedChatModel(script=echo)

    def rejected() -> None:
        with pytest.raises(RuntimeError):
            model.invoke([HumanMessage("hi")], {"callbacks": [handler, _BudgetGuard()]})

    for _ in range(20):  # one context: each call drops the one before
        rejected()
    assert handler.live_state() == {"runs": 1, "roots": 1, "calls": 1}
    model.invoke([HumanMessage("hi")], {"callbacks": [handler]})  # the next call runs
    assert model.seen[-1][0] is not None  # with its own tags
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
    assert current_tags() is None
    assert handler.stats.adapter_errors == 0

    # rejected in many contexts: open calls outside a graph are bounded, oldest first
    monkeypatch.setattr(handler_module, "_MAX_OPEN_CALLS", 5)
    for _ in range(20):
        contextvars.copy_context().run(rejected)
    assert handler.live_state() == {"runs": 5, "roots": 5, "calls": 5}


def test_call_inside_an_open_graph_call_keeps_it_open(strict: TaggingConfig) -> None:
    """A model that calls another inside its generation (under the node's config): the
    outer call is running, not rejected, so it ends normally."""
    inner = ScriptedChatModel(script=echo)

    class Outer(ScriptedChatModel):
        def _generate(
            self,
            messages: list[BaseMessage],
            stop: list[str] | None = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            inner.invoke(messages)
            return ChatResult(generations=[ChatGeneration(message=AIMessage("outer"))])

    outer = Outer(script=echo)

    def node(state: _S) -> _S:
        outer.invoke([HumanMessage("hi")])
        return {"x": "done"}

    app = with_agentspec(_one_node_graph(node), config=strict)
    app.invoke({"x": ""})
    (graph,) = get_handler(app).graphs().values()
    assert sorted(c.status for c in graph.calls.values()) == ["ok", "ok"]


# --------------------------------------------------- 5: middleware, interrupt/resume
def test_middleware_resumed_invocation_keeps_its_query() -> None:
    from langchain.agents import create_agent

    @tool
    def ask(q: str) -> str:
        """Ask the human."""
        return str(interrupt(q))

    @tool
    def search(q: str) -> str:
        """Search."""
        return "results"

    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done == 0:
            return tool_call("ask", {"q": "ok?"}, "c1")
        if done == 1:
            return tool_call("search", {"q": "x"}, "c2")
        return AIMessage(content="final")

    model = ScriptedChatModel(script=script)
    config = TaggingConfig(tags_query_from_thread=False, adapter_raise_errors=True)
    agent = create_agent(
        model, [ask, search], middleware=[AgentSpecMiddleware(config)], checkpointer=InMemorySaver()
    )
    cfg: RunnableConfig = {"configurable": {"thread_id": "t1"}}
    agent.invoke({"messages": [HumanMessage("go")]}, cfg)
    agent.invoke(Command(resume="yes"), cfg)
    agent.invoke({"messages": [HumanMessage("again")]}, cfg)  # a new invocation
    queries = [str(t.query_id) for t, _ in model.seen if t is not None]
    assert len(queries) == 4 and queries[0].startswith("run:")
    assert queries[0] == queries[1] == queries[2] != queries[3]


# -------------------------------------------------- 6: an unopenable trace file
def test_unopenable_trace_file_drops_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handler = AgentSpecCallbackHandler(TaggingConfig(trace_path=tmp_path))  # a folder
    model = ScriptedChatModel(script=echo)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.recorder"):
        for _ in range(20):
            model.invoke([HumanMessage("hi")], {"callbacks": [handler]})
        recorder = handler.recorder
        assert recorder is not None
        flushed = threading.Thread(target=recorder.flush, daemon=True)
        flushed.start()
        flushed.join(5)
        assert not flushed.is_alive()  # flush() returns
        model.invoke([HumanMessage("hi")], {"callbacks": [handler]})
        recorder.flush()
    assert (recorder.written, recorder.failed, recorder._queue.qsize()) == (0, 21, 0)
    assert handler.stats.traces_recorded < 21  # records dropped were not queued
    assert sum("cannot open the trace file" in r.getMessage() for r in caplog.records) == 1
    handler.close()


# --------------------------------------------- 7: a handler given to the model only
def test_model_only_handler_uses_the_thread() -> None:
    handler = AgentSpecCallbackHandler(TaggingConfig(adapter_raise_errors=True))
    model = ScriptedChatModel(script=echo)

    class N(TypedDict):
        n: int

    def agent(state: N) -> N:
        model.invoke([HumanMessage(f"turn {state['n']}")], {"callbacks": [handler]})
        return {"n": state["n"] + 1}

    g = StateGraph(N)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["n"] < 2 else END)
    app = g.compile(checkpointer=InMemorySaver())
    app.invoke({"n": 0}, {"configurable": {"thread_id": "t1"}})
    tags: list[StructureTags | None] = [t for t, _ in model.seen]
    assert [(t.agent_id, t.query_id) for t in tags if t is not None] == [("agent", "thread:t1")] * 2
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}


# ------------------------------------------------ 8: AgentSpecMiddleware(agent=...)
@pytest.mark.parametrize("agent", [42, ["planner"], ""])
def test_middleware_agent_must_be_a_non_empty_str(agent: Any) -> None:
    with pytest.raises(TypeError, match="agent= must be a non-empty str"):
        AgentSpecMiddleware(agent=agent)
    assert AgentSpecMiddleware(agent="planner").agent == "planner"
