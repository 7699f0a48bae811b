"""Review 73 of ``ad884eb``: no LangChain/LangGraph path lets a live root's run id object go
(the handler would then drop a live run's state, keyed by a copy of that id). Each graph
makes a model call in node ``a``, then in node ``b`` collects garbage and drains the handler
(``live_state``) before its own model call: both calls must share one query and the root
must still be live. Also a caller's ``run_id`` given as a string, and a retry with an equal
run id while the rejected first attempt's id object is still alive."""

from __future__ import annotations

import asyncio
import gc
import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel

ZERO = {"runs": 0, "roots": 0, "calls": 0}


@pytest.fixture()
def strict() -> TaggingConfig:
    return TaggingConfig(adapter_raise_errors=True)


def echo(messages: Any, tools: Any) -> AIMessage:
    return AIMessage(content=f"re {messages[-1].content}")


class S(TypedDict, total=False):
    x: str
    y: Annotated[list, operator.add]


HOLDER: dict[str, Any] = {}


def _drain_mid_run() -> None:
    gc.collect()
    state = HOLDER["handler"].live_state()  # drains the let-go queue
    HOLDER.setdefault("mid", []).append(state["roots"])


def _drain_between_yields(i: int) -> None:
    """Collect and drain while a stream is paused at its ``i``-th yield: the first few
    (before and around the first child run) and then every 8th (a collection costs ~0.1 s
    with vLLM and torch imported; node ``b`` drains mid-run anyway)."""
    if i < 3 or i % 8 == 0:
        gc.collect()
        HOLDER["handler"].live_state()


def build(model: ScriptedChatModel, *, fan: bool = False, pause: bool = False, sub: Any = None):
    def a(s: S) -> dict[str, Any]:
        model.invoke([HumanMessage("a " + s.get("x", ""))])
        return {"y": ["a"]}

    def b(s: S) -> dict[str, Any]:
        _drain_mid_run()
        if pause:
            interrupt("wait")
            _drain_mid_run()
        model.invoke([HumanMessage("b " + s.get("x", ""))])
        return {"y": ["b"]}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    if fan:
        g.add_conditional_edges("a", lambda s: [Send("b", {"x": f"f{i}"}) for i in range(3)])
    else:
        g.add_edge("a", "b")
    if sub is not None:
        g.add_node("sub", sub)
        g.add_edge("b", "sub")
        g.add_edge("sub", END)
    else:
        g.add_edge("b", END)
    return g.compile(checkpointer=InMemorySaver() if pause else None)


def _one_query(model: ScriptedChatModel, n: int) -> None:
    seen = model.seen
    assert len(seen) == n
    assert all(t is not None for t, _ in seen), seen
    assert len({t.query_id for t, _ in seen}) == 1, [(t.query_id, m) for t, m in seen]


def _app(strict: TaggingConfig, **kw: Any):
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build(model, **kw), config=strict)
    HOLDER.clear()
    HOLDER["handler"] = get_handler(app)
    return model, app


def _mid_ok() -> None:
    assert HOLDER["mid"] and all(r >= 1 for r in HOLDER["mid"]), HOLDER["mid"]


@pytest.mark.parametrize(
    "mode", ["invoke", "values", "updates", "messages", "debug", "custom", "multi"]
)
def test_sync(strict: TaggingConfig, mode: str) -> None:
    model, app = _app(strict)
    if mode == "invoke":
        app.invoke({"x": "1"})
    else:
        sm: Any = ["values", "updates", "messages", "custom", "debug"] if mode == "multi" else mode
        for i, _ in enumerate(app.stream({"x": "1"}, stream_mode=sm)):
            _drain_between_yields(i)
    _mid_ok()
    _one_query(model, 2)
    assert HOLDER["handler"].live_state() == ZERO


@pytest.mark.parametrize("mode", ["ainvoke", "astream", "events", "abatch"])
def test_async(strict: TaggingConfig, mode: str) -> None:
    model, app = _app(strict)

    async def main() -> None:
        if mode == "ainvoke":
            await app.ainvoke({"x": "1"})
        elif mode == "astream":
            i = 0
            async for _ in app.astream({"x": "1"}, stream_mode=["values", "messages", "updates"]):
                _drain_between_yields(i)
                i += 1
        elif mode == "events":
            i = 0
            async for _ in app.astream_events({"x": "1"}, version="v2"):
                _drain_between_yields(i)
                i += 1
        else:
            await app.abatch([{"x": "1"}])

    asyncio.run(main())
    _mid_ok()
    _one_query(model, 2)


def test_batch(strict: TaggingConfig) -> None:
    model, app = _app(strict)
    app.batch([{"x": "1"}])
    _mid_ok()
    _one_query(model, 2)


@pytest.mark.parametrize("kind", ["uuid", "str"])
def test_user_run_id(strict: TaggingConfig, kind: str) -> None:
    model, app = _app(strict)
    rid: Any = uuid.uuid4()
    app.invoke({"x": "1"}, {"run_id": rid if kind == "uuid" else str(rid)})
    _mid_ok()
    _one_query(model, 2)


def test_user_run_id_object_dropped_by_caller(strict: TaggingConfig) -> None:
    """The config dict (and its run id) is built inline and is not kept by the caller."""
    model, app = _app(strict)
    app.invoke({"x": "1"}, {"run_id": uuid.UUID(int=uuid.uuid4().int)})
    _mid_ok()
    _one_query(model, 2)


def test_send_fanout(strict: TaggingConfig) -> None:
    model, app = _app(strict, fan=True)
    app.invoke({"x": "1"})
    _mid_ok()
    _one_query(model, 4)


def test_subgraph_and_outer_graph(strict: TaggingConfig) -> None:
    inner_model = ScriptedChatModel(script=echo)
    inner = build(inner_model)
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build(model, sub=inner), config=strict)
    HOLDER.clear()
    HOLDER["handler"] = get_handler(app)
    app.invoke({"x": "1"})
    _mid_ok()
    q = {t.query_id for t, _ in model.seen + inner_model.seen if t is not None}
    assert len(model.seen + inner_model.seen) == 4 and len(q) == 1


def test_wrapped_app_as_node_of_unwrapped_graph(strict: TaggingConfig) -> None:
    model = ScriptedChatModel(script=echo)
    app = with_agentspec(build(model), config=strict)
    HOLDER.clear()
    HOLDER["handler"] = get_handler(app)
    g = StateGraph(S)
    g.add_node("inner", app)
    g.add_edge(START, "inner")
    g.add_edge("inner", END)
    g.compile().invoke({"x": "1"})
    _mid_ok()
    _one_query(model, 2)


def test_interrupt_resume(strict: TaggingConfig) -> None:
    model, app = _app(strict, pause=True)
    cfg: Any = {"configurable": {"thread_id": "t1"}}
    app.invoke({"x": "1"}, cfg)
    gc.collect()
    assert HOLDER["handler"].live_state() == ZERO
    app.invoke(Command(resume="go"), cfg)
    _mid_ok()
    _one_query(model, 2)


def test_retry_with_equal_run_id_while_rejected_id_alive(strict: TaggingConfig) -> None:
    """A start rejected by a guard, retried with an equal run id (a new UUID object built
    from the same request id) while the first object is still alive (the caller kept the
    exception: its traceback holds the frame that holds it). The retry is deduplicated
    onto the rejected run's entries; when the first object dies mid-retry, the retry's
    live state is dropped: its later calls get another query."""
    from langchain_core.callbacks import BaseCallbackHandler

    class Reject(BaseCallbackHandler):
        raise_error = True

        def on_chain_start(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("parent_run_id") is None:
                raise RuntimeError("blocked")

    model, app = _app(strict)
    request_id = str(uuid.uuid4())
    kept: list[BaseException] = []
    try:
        app.invoke({"x": "1"}, {"run_id": uuid.UUID(request_id), "callbacks": [Reject()]})
    except RuntimeError as e:
        kept.append(e)  # e.g. last_error = e, for the retry loop's final raise
    it = app.stream({"x": "1"}, {"run_id": uuid.UUID(request_id)}, stream_mode="updates")
    next(it)  # node a ran (one call)
    kept.clear()  # the first attempt's exception goes
    gc.collect()
    for _ in it:
        pass
    _one_query(model, 2)
