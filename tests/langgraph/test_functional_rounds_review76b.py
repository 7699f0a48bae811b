"""Review 76b: the rounds of a functional ``@task``'s fan-out position (1a990e8, after
04d195a), in the cases review 76's tests leave out.

Checked: a ``RetryPolicy`` and a checkpointed re-run after an error, an ``interrupt()`` in
a task after its model call and the resume, a model cache answering a re-run call, the
size of the round tables (a loop past 256 turns, a draft carried by more than 256 later
runs), a prompt carrying replies of two positions, tasks called from tasks and from a
``StateGraph`` node, a subgraph or a middleware's own call inside a task, runs that
continue one draft together making two calls each, reply ids a model sets itself (also on
``AIMessageChunk``), trace records and the replay's ``issued_together``, concurrent
invocations with one ``thread_id`` and with several.

The defects it found were fixed with it; the replay tells calls that ran one after
another apart by the times trace records carry (``meta.started``, ``meta.ended``)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from agentspec_mw.replay.run import issued_together
from agentspec_mw.tags import StructureTags
from agentspec_mw.traces.loader import iter_records
from agentspec_mw.traces.tokenized import CallMeta
from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.redundancy import RedundancyGraph

from .fake_chat import ScriptedChatModel
from .functional_apps import (
    Overlap,
    Script,
    call_tool,
    handler_of,
    model_task,
    react_agent,
    react_script,
    react_subgraph,
    trace_metas,
    two_runs_at_once,
)

STRICT = TaggingConfig(adapter_raise_errors=True)


# ------------------------------------------------------------------------ helpers
def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"{messages[-1].content}!")


def _tags(model: ScriptedChatModel) -> list[StructureTags]:
    tags = [t for t, _ in model.seen]
    assert all(t is not None for t in tags)
    return tags  # type: ignore[return-value]


def _round(tags: StructureTags) -> int:
    """The round a call's fan-out group id names (``…~<round>#<ordinal>``; none: 0)."""
    gid = str(tags.group_id)
    assert "|fanout|" in gid
    found = re.search(r"~(\d+)#\d+$", gid)
    return int(found.group(1)) if found else 0


def _rounds(model: ScriptedChatModel) -> list[int]:
    return [_round(t) for t in _tags(model)]


def _graph_rounds(graph: RedundancyGraph) -> list[int]:
    """The rounds of the graph's LLM calls in start order (a call the model cache answered
    included: the model does not see it)."""
    found = [re.search(r"~(\d+)#\d+$", str(c.group_id)) for c in graph.llm_calls()]
    return [int(f.group(1)) if f else 0 for f in found]


def _graph(app: Any, model: ScriptedChatModel) -> RedundancyGraph:
    return handler_of(app).graph(_tags(model)[0].query_id)


def _edges(graph: RedundancyGraph, kind: str) -> list[tuple[int, int]]:
    """The ``kind`` edges between LLM calls, as their positions in start order."""
    index = {c.call_id: i for i, c in enumerate(graph.llm_calls())}
    return sorted((index[e.src], index[e.dst]) for e in graph.edges if e.kind == kind)


def _repeat_groups(graph: RedundancyGraph) -> list[list[int]]:
    index = {c.call_id: i for i, c in enumerate(graph.llm_calls())}
    return sorted(sorted(index[m] for m in g.members) for g in graph.groups_of("repeat"))


def _together(metas: list[CallMeta]) -> list[tuple[int, int]]:
    """The consecutive records (by ``call_index``) the replay issues together."""
    one, two = np.array([1]), np.array([2])
    return [
        (metas[i - 1].call_index, metas[i].call_index)
        for i in range(1, len(metas))
        if issued_together(metas[i - 1], metas[i], one, two)
    ]


class _FailingAfterCall:
    """Raises ``RuntimeError`` after the model call of the body runs numbered ``fail``."""

    def __init__(self, *fail: int) -> None:
        self.fail, self.runs = set(fail), 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.runs += 1
            run = self.runs
        if run in self.fail:
            raise RuntimeError(f"flaky {run}")


_RETRY = RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False, retry_on=RuntimeError)


# ------------------------------------------------------------- 1. retries
def _retried_agent(model: ScriptedChatModel) -> Any:
    flaky = _FailingAfterCall(1, 3)  # turn 0's and turn 1's first attempts fail

    @task(retry_policy=_RETRY)  # type: ignore[arg-type]
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        reply = model.invoke(messages)
        flaky()
        return reply  # type: ignore[return-value]

    return react_agent(call_model, InMemorySaver())


def test_a_retry_policy_keeps_the_round_and_links_the_attempts() -> None:
    model = ScriptedChatModel(script=react_script(2))
    app = with_agentspec(_retried_agent(model), config=STRICT)
    app.invoke("q", {"configurable": {"thread_id": "retry"}})
    assert _rounds(model) == [0, 0, 1, 1, 2]  # an attempt is in its task run's round
    graph = _graph(app, model)
    assert _edges(graph, "retry") == [(0, 1), (2, 3)]
    assert _edges(graph, "repeat") == [(1, 2), (3, 4)]  # each turn continues the last attempt


def test_a_checkpointed_rerun_after_an_error_keeps_the_round() -> None:
    model = ScriptedChatModel(script=react_script(2))
    flaky = _FailingAfterCall(2)  # turn 1 fails after its model call

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        reply = model.invoke(messages)
        flaky()
        return reply  # type: ignore[return-value]

    app = with_agentspec(react_agent(call_model, InMemorySaver()), config=STRICT)
    config: Any = {"configurable": {"thread_id": "rerun"}}
    with pytest.raises(RuntimeError, match="flaky 2"):
        app.invoke("q", config)
    assert app.invoke(None, config).content == "final q"
    assert _rounds(model) == [0, 1, 1, 2]
    graph = handler_of(app).graph("thread:rerun")
    assert _edges(graph, "retry") == [(1, 2)]
    assert _edges(graph, "repeat") == [(0, 1), (2, 3)]


def test_a_retry_answered_from_the_model_cache_keeps_the_rounds() -> None:
    model = ScriptedChatModel(script=react_script(2), cache=InMemoryCache())
    app = with_agentspec(_retried_agent(model), config=STRICT)
    app.invoke("q", {"configurable": {"thread_id": "retry-cache"}})
    graph = handler_of(app).graph("thread:retry-cache")
    assert _edges(graph, "retry") == [(0, 1), (2, 3)]  # the attempts are still linked
    assert _graph_rounds(graph) == [0, 0, 1, 1, 2]  # observed: [0, 0, 0, 0, 0]


# -------------------------------------------------------- 2. interrupt and resume
def _interrupting_agent(model: ScriptedChatModel) -> Any:
    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        reply = model.invoke(messages)  # made again when the task re-runs on resume
        interrupt("approve this turn?")
        return reply  # type: ignore[return-value]

    return react_agent(call_model, InMemorySaver())


def _run_to_end(app: Any, thread: str) -> Any:
    config: Any = {"configurable": {"thread_id": thread}}
    out = app.invoke("q", config)
    while isinstance(out, dict) and "__interrupt__" in out:
        out = app.invoke(Command(resume="yes"), config)
    return out


def test_a_task_resumed_after_an_interrupt_keeps_its_round() -> None:
    model = ScriptedChatModel(script=react_script(2))
    app = with_agentspec(_interrupting_agent(model), config=STRICT)
    assert _run_to_end(app, "resume").content == "final q"
    # each turn's call, then that call made again by the resumed task run
    assert _rounds(model) == [0, 0, 1, 1, 2, 2]
    graph = handler_of(app).graph("thread:resume")
    assert _edges(graph, "repeat") == [(i - 1, i) for i in range(1, 6)]
    assert _repeat_groups(graph) == [list(range(6))]


def test_a_resumed_call_answered_from_the_model_cache_keeps_the_rounds() -> None:
    model = ScriptedChatModel(script=react_script(2), cache=InMemoryCache())
    app = with_agentspec(_interrupting_agent(model), config=STRICT)
    assert _run_to_end(app, "resume-cache").content == "final q"
    graph = handler_of(app).graph("thread:resume-cache")
    assert _graph_rounds(graph) == [0, 0, 1, 1, 2, 2]  # observed: [0] * 6


# ---------------------------------------------------------------- 3. the caps
def test_a_loop_longer_than_the_tables_keeps_counting_rounds() -> None:
    model = ScriptedChatModel(script=react_script(260))

    call_model = model_task(model)

    app = with_agentspec(react_agent(call_model), config=STRICT)
    assert app.invoke("q").content == "final q"
    assert _rounds(model) == list(range(261))  # the newest entries are the ones carried


def test_a_draft_carried_by_more_than_256_later_runs_keeps_them_in_round_one() -> None:
    model = ScriptedChatModel(script=echo)

    @task
    def write(messages: list[BaseMessage]) -> AIMessage:
        return model.invoke(messages)  # type: ignore[return-value]

    @entrypoint()
    def best_of(question: str) -> int:
        messages: list[BaseMessage] = [HumanMessage(question)]
        draft = write(messages).result()
        tries = [write([*messages, draft, HumanMessage(f"try {i}")]).result() for i in range(300)]
        return len(tries)

    app = with_agentspec(best_of, config=STRICT)
    assert app.invoke("q") == 300
    rounds = Counter(_rounds(model))
    assert rounds == {0: 1, 1: 300}  # observed: {1: 256, 0: 45}


# --------------------------------------------------- 4. replies of two positions
def test_a_prompt_carrying_a_planners_and_its_own_replies() -> None:
    model = ScriptedChatModel(script=react_script(2))

    @task
    def plan(question: str) -> AIMessage:
        return model.invoke([HumanMessage(f"plan {question}")])  # type: ignore[return-value]

    call_model = model_task(model)

    @entrypoint()
    def flow(question: str) -> AIMessage:
        outline = plan(question).result()
        messages: list[BaseMessage] = [HumanMessage(question), outline, HumanMessage("go")]
        reply = call_model(messages).result()
        while reply.tool_calls:
            messages = [*messages, reply, *[call_tool(c).result() for c in reply.tool_calls]]
            reply = call_model(messages).result()
        return reply

    app = with_agentspec(flow, config=STRICT)
    app.invoke("q")
    tags = _tags(model)
    assert len(tags) == 4
    assert "/plan@" in str(tags[0].group_id) and _round(tags[0]) == 0
    # the planner's reply is another position's: the loop counts its own rounds only
    assert [_round(t) for t in tags[1:]] == [0, 1, 2]
    assert all("/call_model@" in str(t.group_id) for t in tags[1:])
    graph = _graph(app, model)
    assert _edges(graph, "repeat") == [(1, 2), (2, 3)]  # the planner is not continued


# ------------------------------------------------------------------- 5. nesting
def test_tasks_called_from_a_task_count_rounds() -> None:
    """Legal in this LangGraph: an inner task's namespace is nested in the outer one's."""
    model = ScriptedChatModel(script=react_script(2))

    call_model = model_task(model)

    @task
    def run_agent(question: str) -> str:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = call_model(messages).result()
        while reply.tool_calls:
            messages = [*messages, reply, *[call_tool(c).result() for c in reply.tool_calls]]
            reply = call_model(messages).result()
        return str(reply.content)

    @entrypoint()
    def outer(questions: list[str]) -> list[str]:
        return [f.result() for f in [run_agent(q) for q in questions]]

    app = with_agentspec(outer, config=STRICT)
    assert app.invoke(["A", "B"]) == ["final A", "final B"]
    tags = _tags(model)
    assert len(tags) == 6
    assert all("/run_agent@" in str(t.group_id) for t in tags)
    assert sorted(_round(t) for t in tags) == [0, 0, 1, 1, 2, 2]
    graph = _graph(app, model)
    assert sorted(len(g.members) for g in graph.groups_of("fanout")) == [2, 2, 2]
    assert sorted(len(g) for g in _repeat_groups(graph)) == [3, 3]  # one per agent


def test_a_task_called_in_a_state_graph_node() -> None:
    """A loop of task calls in one node run counts rounds; the same task called at later
    steps of the graph is another position each step (round 0)."""
    model = ScriptedChatModel(script=react_script(2))

    call_model = model_task(model)

    def looping(state: MessagesState) -> dict[str, Any]:
        messages: list[BaseMessage] = list(state["messages"])
        reply = call_model(messages).result()
        while reply.tool_calls:
            messages = [*messages, reply, *[call_tool(c).result() for c in reply.tool_calls]]
            reply = call_model(messages).result()
        return {"messages": [reply]}

    g = StateGraph(MessagesState)
    g.add_node("looping", looping)
    g.add_edge(START, "looping")
    g.add_edge("looping", END)
    app = with_agentspec(g.compile(), config=STRICT)
    app.invoke({"messages": [HumanMessage("q")]})
    assert _rounds(model) == [0, 1, 2]
    assert all("looping@1/call_model@1" in str(t.group_id) for t in _tags(model))

    model2 = ScriptedChatModel(script=react_script(2))

    @task
    def call_model2(messages: list[BaseMessage]) -> AIMessage:
        return model2.invoke(messages)  # type: ignore[return-value]

    app2 = with_agentspec(react_subgraph(lambda m: call_model2(m).result()), config=STRICT)
    app2.invoke({"messages": [HumanMessage("q")]})
    tags = _tags(model2)
    assert [_round(t) for t in tags] == [0, 0, 0]
    assert len({t.group_id for t in tags}) == 3  # llm@1, llm@3, llm@5
    assert _edges(_graph(app2, model2), "repeat") == [(0, 1), (1, 2)]


def _two_agent_subgraph(model: ScriptedChatModel) -> Any:
    def draft(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([*state["messages"], HumanMessage("draft")])]}

    def review(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([*state["messages"], HumanMessage("review")])]}

    sub = StateGraph(MessagesState)
    sub.add_node("draft", draft)
    sub.add_node("review", review)
    sub.add_edge(START, "draft")
    sub.add_edge("draft", "review")
    sub.add_edge("review", END)
    return sub.compile()


def test_agents_of_a_subgraph_in_a_task_keep_their_own_instances() -> None:
    model = ScriptedChatModel(script=echo)
    sub = _two_agent_subgraph(model)

    @task
    def step(messages: list[BaseMessage]) -> list[BaseMessage]:
        return sub.invoke({"messages": messages})["messages"]  # type: ignore[no-any-return]

    @entrypoint()
    def flow(question: str) -> int:
        messages: list[BaseMessage] = [HumanMessage(question)]
        for _ in range(2):
            messages = step(messages).result()
        return len(messages)

    app = with_agentspec(flow, config=STRICT)
    assert app.invoke("q") == 5
    tags = _tags(model)
    assert [str(t.agent_id).rsplit("/", 1)[-1] for t in tags] == ["draft", "review"] * 2
    assert _rounds(model) == [0, 0, 1, 1]
    graph = _graph(app, model)
    assert _repeat_groups(graph) == [[0, 2], [1, 3]]  # observed: [[0, 1, 2, 3]]


@pytest.mark.parametrize("summary", ["after", "before"])
def test_a_middlewares_own_call_in_a_task_is_an_instance_apart(summary: str) -> None:
    model = ScriptedChatModel(script=echo)
    config: Any = {"metadata": {"lc_source": "summarization"}}

    @task
    def turn(messages: list[BaseMessage]) -> AIMessage:
        if summary == "before":
            model.invoke([HumanMessage("summarize")], config=config)
        reply = model.invoke(messages)
        if summary == "after":
            model.invoke([HumanMessage("summarize")], config=config)
        return reply  # type: ignore[return-value]

    @entrypoint()
    def flow(question: str) -> str:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = turn(messages).result()
        return str(turn([*messages, reply, HumanMessage("more")]).result().content)

    app = with_agentspec(flow, config=STRICT)
    app.invoke("q")
    tags = _tags(model)
    is_summary = [str(t.agent_id).endswith("/summarization") for t in tags]
    agent = [i for i, s in enumerate(is_summary) if not s]
    assert len(agent) == 2 and is_summary.count(True) == 2
    assert [_round(tags[i]) for i in agent] == [0, 1]  # observed ("before"): [0, 0]
    graph = _graph(app, model)
    mixed = [e for e in _edges(graph, "repeat") if is_summary[e[0]] != is_summary[e[1]]]
    assert mixed == []  # observed: the agent's call and the summary linked as repeats
    assert agent in _repeat_groups(graph)


def test_refinements_making_two_calls_each_repeat_their_own_first_call() -> None:
    overlap = Overlap(0.05)
    model = ScriptedChatModel(script=overlap)

    @task
    def write(messages: list[BaseMessage]) -> AIMessage:
        first = model.invoke(messages)
        time.sleep(0.02)
        return model.invoke([*messages, first, HumanMessage("polish")])  # type: ignore[return-value]

    @entrypoint()
    def flow(question: str) -> list[str]:
        messages: list[BaseMessage] = [HumanMessage(question)]
        draft = write(messages).result()
        rounds = [write([*messages, draft, HumanMessage(f"refine {i}")]) for i in range(3)]
        return [str(f.result().content) for f in rounds]

    app = with_agentspec(flow, config=STRICT)
    app.invoke("q")
    assert overlap.most == 3
    graph = _graph(app, model)
    calls = graph.llm_calls()
    assert len(calls) == 8
    run_of = {i: c.namespace for i, c in enumerate(calls)}
    second_calls = [i for i, c in enumerate(calls) if i > 1 and c.ordinal == 1]
    assert len(second_calls) == 3
    for src, dst in _edges(graph, "repeat"):
        if dst in second_calls:  # observed: 4 -> 5, 5 -> 6, 6 -> 7
            assert run_of[src] == run_of[dst]


# ---------------------------------------------------------------- 6. reply ids
def _fixed_id(script: Script) -> Script:
    def fixed(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        reply = script(messages, tools)
        return AIMessage(content=reply.content, tool_calls=reply.tool_calls, id="x")

    return fixed


class _ChunkIds(ScriptedChatModel):
    """Streams chunks carrying one provider id, ``chatcmpl-1``, on every call."""

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for chunk in super()._stream(*args, **kwargs):
            chunk.message.id = "chatcmpl-1"
            yield chunk


def _loop_with_ids(how: str) -> tuple[ScriptedChatModel, list[str | None]]:
    model = (
        ScriptedChatModel(script=_fixed_id(react_script(3)))
        if how == "invoke"
        else _ChunkIds(script=react_script(3))
    )
    ids: list[str | None] = []

    @task
    def call_model(messages: list[BaseMessage]) -> BaseMessage:
        if how == "invoke":
            reply: Any = model.invoke(messages)
        else:
            reply = None
            for chunk in model.stream(messages):
                reply = chunk if reply is None else reply + chunk
        ids.append(reply.id)
        return reply  # type: ignore[no-any-return]

    app = with_agentspec(react_agent(call_model), config=STRICT)
    assert app.invoke("q").content == "final q"
    return model, ids


@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_langchain_keeps_the_id_a_model_sets(how: str) -> None:
    """LangChain names a reply ``lc_run-<run id>`` only when the model left the id unset;
    merged chunks take the provider's id over LangChain's."""
    _, ids = _loop_with_ids(how)
    assert ids == ["x" if how == "invoke" else "chatcmpl-1"] * 4


@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_a_loop_whose_model_reuses_a_reply_id_keeps_counting_rounds(how: str) -> None:
    model, _ = _loop_with_ids(how)
    rounds = _rounds(model)
    assert rounds[:2] == [0, 1]
    assert rounds == sorted(set(rounds)), rounds  # observed: [0, 1, 0, 0]


# ----------------------------------------------------- 7. traces and the replay
def test_a_loops_turns_are_never_issued_together(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    model = ScriptedChatModel(script=react_script(3))

    call_model = model_task(model)

    config = TaggingConfig(adapter_raise_errors=True, trace_path=path)
    app = with_agentspec(react_agent(call_model), config=config)
    app.invoke("q")
    handler_of(app).close()
    metas = trace_metas(path)
    assert len(metas) == 4 and len({m.parent_group for m in metas}) == 4
    assert _together(metas) == []


class _Clock:
    """Each call's (start, end) times, by the text of its first message and its turn."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.spans: dict[tuple[str, int], tuple[float, float]] = {}

    def __call__(self, messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        start = time.monotonic()
        time.sleep(0.05)
        reply = self.script(messages, tools)
        turn = sum(isinstance(m, ToolMessage) for m in messages)
        self.spans[(str(messages[0].content), turn)] = (start, time.monotonic())
        return reply


def test_side_by_side_agents_turns_issued_together_ran_together(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    clock = _Clock(react_script(1))
    model = ScriptedChatModel(script=clock)

    call_model = model_task(model)

    @task
    def slow_for_b(call: Any) -> ToolMessage:
        # A's turn 1 starts after both turn 0s ended, B's long after A's turn 1 ended
        time.sleep(0.4 if call["args"]["who"] == "B" else 0.1)
        return ToolMessage(content="res", tool_call_id=call["id"])

    @task
    def run_agent(question: str) -> str:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = call_model(messages).result()
        while reply.tool_calls:
            messages = [*messages, reply, *[slow_for_b(c).result() for c in reply.tool_calls]]
            reply = call_model(messages).result()
        return str(reply.content)

    @entrypoint()
    def flow(questions: list[str]) -> list[str]:
        return [f.result() for f in [run_agent(q) for q in questions]]

    app = with_agentspec(flow, config=TaggingConfig(adapter_raise_errors=True, trace_path=path))
    assert app.invoke(["A", "B"]) == ["final A", "final B"]
    handler_of(app).close()
    a1, b1 = clock.spans[("A", 1)], clock.spans[("B", 1)]
    assert a1[1] < b1[0]  # A's turn 1 had ended before B's began
    # turn 1's prompts hold the question, the turn 0 reply and the tool result
    turn_one = {r.call_index for r in iter_records(path) if len(r.prompt) > 1}
    assert len(turn_one) == 2
    together = _together(trace_metas(path))
    assert not any(a in turn_one and b in turn_one for a, b in together)  # observed: both


@pytest.mark.parametrize("how", ["resume", "retry"])
def test_a_rerun_call_is_not_issued_with_the_call_before_it(how: str, tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    model = ScriptedChatModel(script=react_script(1))
    config = TaggingConfig(adapter_raise_errors=True, trace_path=path)
    if how == "resume":
        app = with_agentspec(_interrupting_agent(model), config=config)
        _run_to_end(app, "t")
    else:
        app = with_agentspec(_retried_agent(model), config=config)
        app.invoke("q", {"configurable": {"thread_id": "t"}})
    handler_of(app).close()
    metas = trace_metas(path)
    assert len(metas) == 4
    assert _together(metas) == []  # observed: [(0, 1), (2, 3)]


# ------------------------------------------------------------------ 8. threads
@pytest.mark.parametrize("threads", ["one", "two"])
def test_concurrent_invocations_of_a_checkpointed_loop(threads: str) -> None:
    model = ScriptedChatModel(script=react_script(3, delay=0.01))

    call_model = model_task(model)

    app = with_agentspec(react_agent(call_model, InMemorySaver()), config=STRICT)

    def config(question: str) -> Any:
        return {"configurable": {"thread_id": "shared" if threads == "one" else f"t-{question}"}}

    by_run = two_runs_at_once(app, lambda: model.seen, config)
    assert [len(v) for v in by_run.values()] == [4, 4]
    assert len({t.query_id for v in by_run.values() for t in v}) == 2
    handler = handler_of(app)
    for tags_of_run in by_run.values():
        assert [_round(t) for t in tags_of_run] == [0, 1, 2, 3]
        graph = handler.graph(tags_of_run[0].query_id)
        assert _edges(graph, "repeat") == [(0, 1), (1, 2), (2, 3)]
    assert handler.live_state() == {"runs": 0, "roots": 0, "calls": 0}
