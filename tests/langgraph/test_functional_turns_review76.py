"""Review 76: the rounds of a functional ``@task``'s fan-out position. A call whose
prompt carries replies of earlier task runs at its position is in the round after the
latest of them; each round is a fan-out group; a run that carries one run of that round
continues it (a ``repeat``).

Checked: a ReAct loop's turns (sync and async tasks, ``ainvoke``, ``astream``, streamed
replies, ``ChatOpenAI``: the chat-completions message id is LangChain's run id), an
interrupt and its resume, a re-invocation of the thread, a loop inside a nested entrypoint
or a subgraph, concurrent invocations; refinements of one draft and a debate's rounds
(calls made together), two functional agents looping side by side, a task making two
calls a turn, routing at ``fanout`` granularity, reply ids a server reuses, the size of
the reply index; ``Send`` fan-outs (unchanged: the rounds are a ``@task``'s only)."""

from __future__ import annotations

import asyncio
import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
import numpy as np
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send, interrupt

from agentspec_mw.replay.run import issued_together
from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.redundancy import RedundancyGraph

from .fake_chat import ScriptedChatModel
from .fake_openai import FakeOpenAI
from .functional_apps import (
    Overlap,
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
URL = "http://127.0.0.1:9/v1"


def echo(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
    return AIMessage(content=f"re: {messages[-1].content}")


def _rounds(tags: list[StructureTags | None]) -> None:
    """Turn ``i`` of a loop is round ``i`` of its fan-out position: ``<position>#0``,
    ``<position>~1#0``, ``<position>~2#0`` ..."""
    assert len(tags) >= 2 and all(t is not None for t in tags)
    gids = [str(t.group_id) for t in tags]  # type: ignore[union-attr]
    assert "|fanout|" in gids[0] and gids[0].endswith("#0")
    position = gids[0].removesuffix("#0")
    assert gids[1:] == [f"{position}~{i}#0" for i in range(1, len(gids))]


def _turns_are_repeats(tags: list[StructureTags | None], graph: RedundancyGraph) -> None:
    """Each turn is a round of one member of its position, and a repeat of the turn
    before: the graph holds one-member fan-outs, one repeat group of every turn and the
    chain of repeat edges."""
    _rounds(tags)
    assert [len(g.members) for g in graph.groups_of("fanout")] == [1] * len(tags)
    (repeat,) = graph.groups_of("repeat")
    assert len(repeat.members) == len(tags)
    index = _index(graph)
    edges = sorted((index[e.src], index[e.dst]) for e in graph.edges if e.kind == "repeat")
    assert edges == [(i - 1, i) for i in range(1, len(tags))]


def _seen_tags(model: ScriptedChatModel) -> list[StructureTags | None]:
    return [tags for tags, _ in model.seen]


def _index(graph: RedundancyGraph) -> dict[str, int]:
    """Each LLM call's position in start order."""
    return {c.call_id: i for i, c in enumerate(graph.llm_calls())}


# ---------------------------------------------------------- 1. async: ainvoke, astream
@pytest.mark.parametrize("how", ["ainvoke", "astream"])
def test_async_tasks_turns_are_repeats(how: str) -> None:
    model = ScriptedChatModel(script=react_script(2))

    @task
    async def call_model(messages: list[BaseMessage]) -> AIMessage:
        return await model.ainvoke(messages)  # type: ignore[return-value]

    @task
    async def acall_tool(call: dict[str, Any]) -> ToolMessage:
        return ToolMessage(content="res", tool_call_id=call["id"])

    @entrypoint()
    async def agent(question: str) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = await call_model(messages)
        while reply.tool_calls:
            results = await asyncio.gather(*[acall_tool(c) for c in reply.tool_calls])
            messages = [*messages, reply, *results]
            reply = await call_model(messages)
        return reply

    app = with_agentspec(agent, config=STRICT)

    async def run() -> None:
        if how == "ainvoke":
            await app.ainvoke("q")
        else:
            async for _ in app.astream("q", stream_mode=["messages", "updates"]):
                pass

    asyncio.run(run())
    tags = _seen_tags(model)
    assert len(tags) == 3
    _turns_are_repeats(tags, handler_of(app).graph(tags[0].query_id))  # type: ignore[union-attr]


# ------------------------------------------------------------ 2. streamed replies
@pytest.mark.parametrize("how", ["stream", "astream", "stream_mode_messages"])
def test_a_streamed_reply_is_recognised_in_the_next_prompt(how: str) -> None:
    """The reply recorded at ``on_llm_end`` (merged chunks) has the id of the message the
    task builds from the chunks (or gets from ``invoke`` under a messages stream)."""
    model = ScriptedChatModel(script=react_script(2))

    @task
    def call_model(messages: list[BaseMessage]) -> BaseMessage:
        if how == "stream_mode_messages":
            return model.invoke(messages)
        full: Any = None
        for chunk in model.stream(messages):
            full = chunk if full is None else full + chunk
        return full  # type: ignore[no-any-return]

    @task
    async def acall_model(messages: list[BaseMessage]) -> BaseMessage:
        full: Any = None
        async for chunk in model.astream(messages):
            full = chunk if full is None else full + chunk
        return full  # type: ignore[no-any-return]

    @entrypoint()
    async def async_agent(question: str) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply: Any = await acall_model(messages)
        while reply.tool_calls:
            results = [await call_tool(c) for c in reply.tool_calls]
            messages = [*messages, reply, *results]
            reply = await acall_model(messages)
        return reply  # type: ignore[no-any-return]

    if how == "astream":
        app = with_agentspec(async_agent, config=STRICT)
        asyncio.run(app.ainvoke("q"))
    else:
        app = with_agentspec(react_agent(call_model), config=STRICT)
        if how == "stream":
            app.invoke("q")
        else:
            for _ in app.stream("q", stream_mode="messages"):
                pass
    tags = _seen_tags(model)
    assert len(tags) == 3
    _turns_are_repeats(tags, handler_of(app).graph(tags[0].query_id))  # type: ignore[union-attr]


# ------------------------------------------------ 3. ChatOpenAI against a fake server
@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"res {query}"


def _chat_openai(transport: httpx.MockTransport, **kwargs: Any) -> BaseChatModel:
    openai = pytest.importorskip("langchain_openai")
    return openai.ChatOpenAI(  # type: ignore[no-any-return]
        model="m",
        base_url=URL,
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(transport=transport),
        http_async_client=httpx.AsyncClient(transport=transport),
        **kwargs,
    )


def _openai_agent(model: Any, replies: list[AIMessage]) -> Any:
    """A functional ReAct agent on a ``ChatOpenAI`` with ``lookup`` bound, keeping its
    replies in ``replies``."""

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        reply: AIMessage = model.invoke(messages)
        replies.append(reply)
        return reply

    @task
    def run_tool(call: Any) -> ToolMessage:
        return lookup.invoke({**call, "type": "tool_call"})  # type: ignore[no-any-return]

    @entrypoint()
    def agent(question: str) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = call_model(messages).result()
        while reply.tool_calls:
            messages = [*messages, reply, *[run_tool(c).result() for c in reply.tool_calls]]
            reply = call_model(messages).result()
        return reply

    return agent


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_openai_loop_turns_are_repeats(streaming: bool) -> None:
    """The fake server answers every request with the id ``chatcmpl-1``: harmless, the
    chat-completions message's id is LangChain's run id (the provider's id is in its
    ``response_metadata``)."""
    server = FakeOpenAI()
    model = _chat_openai(server.transport, streaming=streaming).bind_tools([lookup])
    replies: list[AIMessage] = []
    app = with_agentspec(_openai_agent(model, replies), config=STRICT, engine=URL)
    app.invoke("q")
    assert len(replies) == 2 and all(str(r.id).startswith("lc_run-") for r in replies)
    tags = [tags_from_wire(body["vllm_xargs"]) for body in server.bodies]
    assert len(tags) == 2
    _turns_are_repeats(tags, handler_of(app).graph(tags[0].query_id))  # type: ignore[union-attr]


def _responses_server(unique_ids: bool) -> httpx.MockTransport:
    """A minimal OpenAI Responses API: each response's (and its message item's) id is
    ``resp_<n>`` / ``msg_<n>``, or ``resp_1`` / ``msg_1`` every time."""
    count = [0]

    def handle(request: httpx.Request) -> httpx.Response:
        json.loads(request.read())
        count[0] += 1
        n = count[0] if unique_ids else 1
        usage: dict[str, Any] = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
        usage |= {"input_tokens_details": {"cached_tokens": 0}}
        usage |= {"output_tokens_details": {"reasoning_tokens": 0}}
        text: dict[str, Any] = {
            "type": "output_text",
            "text": f"answer {count[0]}",
            "annotations": [],
        }
        item: dict[str, Any] = {"type": "message", "id": f"msg_{n}", "role": "assistant"}
        item |= {"status": "completed", "content": [text]}
        data: dict[str, Any] = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": "m",
        }
        data |= {"status": "completed", "output": [item], "parallel_tool_calls": True}
        data |= {"tool_choice": "auto", "tools": [], "usage": usage}
        return httpx.Response(200, json=data)

    return httpx.MockTransport(handle)


def _plan_then_research(model: BaseChatModel) -> Any:
    """A planner, then two research tasks (one after another) carrying its reply."""

    @task
    def plan(question: str) -> BaseMessage:
        return model.invoke([HumanMessage(f"plan {question}")])

    @task
    def research(outline: BaseMessage, topic: str) -> str:
        prompt = [HumanMessage("plan"), outline, HumanMessage(f"research {topic}")]
        return model.invoke(prompt).text

    @entrypoint()
    def flow(question: str) -> list[str]:
        outline = plan(question).result()
        return [research(outline, t).result() for t in ("a", "b")]

    return flow


def _research_fanouts(app: Any) -> list[list[str]]:
    handler = handler_of(app)
    (graph,) = handler.graphs().values()
    return [g.members for g in graph.groups_of("fanout") if "research" in g.group_id]


def test_responses_api_siblings_with_unique_ids_stay_a_fanout() -> None:
    model = _chat_openai(_responses_server(unique_ids=True), use_responses_api=True)
    app = with_agentspec(_plan_then_research(model), config=STRICT)
    assert app.invoke("q") == ["answer 2", "answer 3"]
    (members,) = _research_fanouts(app)
    assert len(members) == 2


def test_responses_api_siblings_with_reused_ids_stay_a_fanout() -> None:
    model = _chat_openai(_responses_server(unique_ids=False), use_responses_api=True)
    app = with_agentspec(_plan_then_research(model), config=STRICT)
    assert app.invoke("q") == ["answer 2", "answer 3"]
    assert [len(m) for m in _research_fanouts(app)] == [2]


# --------------------------------------------------- 4. interrupt, resume, re-invoke
def test_interrupts_resumes_and_a_reinvocation_of_the_thread() -> None:
    model = ScriptedChatModel(script=react_script(3))

    call_model = model_task(model)

    @task
    def approved_tool(call: Any) -> ToolMessage:
        answer = interrupt({"approve": call["id"]})  # every tool run asks
        return ToolMessage(content=f"res {answer}", tool_call_id=call["id"])

    @entrypoint(checkpointer=InMemorySaver())
    def agent(question: str) -> AIMessage:
        messages: list[BaseMessage] = [HumanMessage(question)]
        reply = call_model(messages).result()
        while reply.tool_calls:
            interrupt("next turn?")  # and the entrypoint itself, between turns
            results = [approved_tool(c).result() for c in reply.tool_calls]
            messages = [*messages, reply, *results]
            reply = call_model(messages).result()
        return reply

    app = with_agentspec(agent, config=STRICT)
    config: Any = {"configurable": {"thread_id": "t76"}}
    out = app.invoke("q", config)
    resumes = 0
    while isinstance(out, dict) and "__interrupt__" in out:
        out = app.invoke(Command(resume="ok"), config)
        resumes += 1
    assert resumes == 6 and isinstance(out, AIMessage)
    tags = _seen_tags(model)
    assert len(tags) == 4
    graph = handler_of(app).graph("thread:t76")
    _turns_are_repeats(tags, graph)
    # the thread's next run: a new position (its step), then that run's next turn
    out = app.invoke("q2", config)
    while isinstance(out, dict) and "__interrupt__" in out:
        out = app.invoke(Command(resume="ok"), config)
    again = _seen_tags(model)[4:]
    assert len(again) == 4 and again[0] is not None
    assert again[0].group_id != tags[0].group_id  # type: ignore[union-attr]
    _rounds(again)
    graph = handler_of(app).graph("thread:t76")
    assert [len(g.members) for g in graph.groups_of("fanout")] == [1] * 8
    (repeat,) = graph.groups_of("repeat")  # one instance across the thread's runs
    assert len(repeat.members) == 8


# ------------------------------------------------ 5. a loop inside a nested graph
def test_a_loop_in_a_nested_entrypoint_run_by_a_task() -> None:
    model = ScriptedChatModel(script=react_script(2))

    call_model = model_task(model)

    inner = react_agent(call_model)

    @task
    def run_agent(question: str) -> str:
        return str(inner.invoke(question).content)

    @entrypoint()
    def outer(question: str) -> str:
        return run_agent(question).result()  # type: ignore[no-any-return]

    app = with_agentspec(outer, config=STRICT)
    assert app.invoke("A") == "final A"
    tags = _seen_tags(model)
    assert len(tags) == 3
    _turns_are_repeats(tags, handler_of(app).graph(tags[0].query_id))  # type: ignore[union-attr]


def test_a_loop_whose_model_runs_in_a_subgraph_the_task_invokes() -> None:
    model = ScriptedChatModel(script=react_script(2))

    def llm(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    sub = StateGraph(MessagesState)
    sub.add_node("llm", llm)
    sub.add_edge(START, "llm")
    sub.add_edge("llm", END)
    compiled: Any = sub.compile()

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        return compiled.invoke({"messages": messages})["messages"][-1]  # type: ignore[no-any-return]

    app = with_agentspec(react_agent(call_model), config=STRICT)
    app.invoke("A")
    tags = _seen_tags(model)
    assert len(tags) == 3
    _turns_are_repeats(tags, handler_of(app).graph(tags[0].query_id))  # type: ignore[union-attr]


# ------------------------------------- 7. Graph API: a Send fan-out of ReAct subgraphs
class _Fan(TypedDict):
    questions: list[str]
    answers: Annotated[list[str], operator.add]


def test_send_fanout_of_react_subgraphs_is_unchanged() -> None:
    """Each turn of the siblings is a fan-out (the inner step is part of the position),
    each sibling's turns a repeat of its own (as before 04d195a)."""
    model = ScriptedChatModel(script=react_script(2))
    react = react_subgraph(model.invoke)

    def worker(state: Any) -> dict[str, Any]:
        out = react.invoke({"messages": [HumanMessage(state["q"])]})
        return {"answers": [str(out["messages"][-1].content)]}

    g = StateGraph(_Fan)
    g.add_node("worker", worker)
    g.add_conditional_edges(
        START, lambda s: [Send("worker", {"q": q}) for q in s["questions"]], ["worker"]
    )
    g.add_edge("worker", END)
    app = with_agentspec(g.compile(), config=STRICT)
    out = app.invoke({"questions": ["A", "B"], "answers": []})
    assert sorted(out["answers"]) == ["final A", "final B"]
    tags = _seen_tags(model)
    assert len(tags) == 6 and all(t is not None and t.group_kind == "fanout" for t in tags)
    graph = handler_of(app).graph(tags[0].query_id)  # type: ignore[union-attr]
    assert sorted(len(g.members) for g in graph.groups_of("fanout")) == [2, 2, 2]
    assert sorted(len(g.members) for g in graph.groups_of("repeat")) == [3, 3]


# --------------------------------------------------- 8. concurrent invocations
@pytest.mark.parametrize("thread_id", [None, "shared"])
def test_concurrent_invocations_keep_their_turns_apart(thread_id: str | None) -> None:
    model = ScriptedChatModel(script=react_script(3, delay=0.01))

    call_model = model_task(model)

    app = with_agentspec(react_agent(call_model), config=STRICT)
    config: Any = {"configurable": {"thread_id": thread_id}} if thread_id else None
    by_run = two_runs_at_once(app, lambda: model.seen, lambda _: config)
    assert [len(v) for v in by_run.values()] == [4, 4]
    queries = {run: {t.query_id for t in v} for run, v in by_run.items()}
    assert all(len(q) == 1 for q in queries.values()) and queries["Q0"] != queries["Q1"]
    for tags_of_run in by_run.values():
        graph = handler_of(app).graph(tags_of_run[0].query_id)
        _turns_are_repeats(list(tags_of_run), graph)


# ------------------------------ 6. concurrent calls carrying one earlier reply (defects)
def _refinements(tmp_path: Path) -> tuple[Any, ScriptedChatModel, Overlap, Path]:
    """A draft, then three refinements of it made together."""
    overlap = Overlap(0.1)
    model = ScriptedChatModel(script=overlap)

    @task
    def write(messages: list[BaseMessage]) -> AIMessage:
        return model.invoke(messages)  # type: ignore[return-value]

    @entrypoint()
    def flow(question: str) -> list[str]:
        messages: list[BaseMessage] = [HumanMessage(question)]
        draft = write(messages).result()
        rounds = [write([*messages, draft, HumanMessage(f"refine {i}")]) for i in range(3)]
        return [str(f.result().content) for f in rounds]

    path = tmp_path / "calls.jsonl"
    app = with_agentspec(flow, config=TaggingConfig(adapter_raise_errors=True, trace_path=path))
    app.invoke("q")
    handler_of(app).close()
    return app, model, overlap, path


def test_concurrent_refinements_are_the_drafts_next_round(tmp_path: Path) -> None:
    """Refinements made together that carry the draft are one fan-out: the round after
    the draft's."""
    _, model, overlap, _ = _refinements(tmp_path)
    assert overlap.most == 3
    tags = _seen_tags(model)
    assert len(tags) == 4 and all(t is not None and t.group_kind == "fanout" for t in tags)
    draft = str(tags[0].group_id)  # type: ignore[union-attr]
    round_one = draft.removesuffix("#0") + "~1#0"
    assert [t.group_id for t in tags[1:]] == [round_one] * 3  # type: ignore[union-attr]


def test_concurrent_refinements_repeat_the_draft_and_are_issued_together(
    tmp_path: Path,
) -> None:
    app, model, overlap, path = _refinements(tmp_path)
    assert overlap.most == 3
    graph = handler_of(app).graph(_seen_tags(model)[0].query_id)  # type: ignore[union-attr]
    index = _index(graph)
    repeats = sorted((index[e.src], index[e.dst]) for e in graph.edges if e.kind == "repeat")
    assert repeats == [(0, 1), (0, 2), (0, 3)]  # each refinement continues the draft
    metas = trace_metas(path)
    metas.sort(key=lambda m: m.call_index)
    one, two = np.array([1]), np.array([2])
    assert [issued_together(metas[i - 1], metas[i], one, two) for i in (2, 3)] == [True, True]


def test_a_debate_round_is_not_one_debaters_chain_of_repeats() -> None:
    overlap = Overlap(0.05)
    model = ScriptedChatModel(script=overlap)

    @task
    def debater(name: str, history: list[BaseMessage]) -> AIMessage:
        return model.invoke([*history, HumanMessage(f"{name} speaks")])  # type: ignore[return-value]

    @entrypoint()
    def debate(question: str) -> int:
        history: list[BaseMessage] = [HumanMessage(question)]
        for _ in range(2):
            history = [*history, *[f.result() for f in [debater(n, history) for n in "ABC"]]]
        return len(history)

    app = with_agentspec(debate, config=STRICT)
    assert app.invoke("topic") == 7
    assert overlap.most == 3
    graph = handler_of(app).graph(_seen_tags(model)[0].query_id)  # type: ignore[union-attr]
    index = _index(graph)
    round_two = {i for i in index.values() if i >= 3}
    chained = [e for e in graph.edges if index[e.src] in round_two and index[e.dst] in round_two]
    assert chained == []  # calls that ran together are not repeats of each other
    repeat_sizes = sorted(len(g.members) for g in graph.groups_of("repeat"))
    assert repeat_sizes != [4]  # not all of round 2 in one debater's instance


def test_parallel_functional_agents_later_turns_are_a_fanout() -> None:
    model = ScriptedChatModel(script=react_script(2, delay=0.02))

    call_model = model_task(model)

    inner = react_agent(call_model)

    @task
    def run_agent(question: str) -> str:
        return str(inner.invoke(question).content)

    @entrypoint()
    def outer(questions: list[str]) -> list[str]:
        return [f.result() for f in [run_agent(q) for q in questions]]

    app = with_agentspec(outer, config=STRICT)
    assert app.invoke(["A", "B"]) == ["final A", "final B"]
    tags = _seen_tags(model)
    assert len(tags) == 6
    graph = handler_of(app).graph(tags[0].query_id)  # type: ignore[union-attr]
    assert sorted(len(g.members) for g in graph.groups_of("fanout")) == [2, 2, 2]


# ------------------------------------------------ further defects of the change
class _Chat(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]


def test_send_siblings_in_a_threads_next_run_stay_a_fanout() -> None:
    model = ScriptedChatModel(script=echo)

    def worker(state: Any) -> dict[str, Any]:
        prompt = [*state["messages"], HumanMessage(f"angle {state['angle']}")]
        return {"messages": [model.invoke(prompt)]}

    g = StateGraph(_Chat)
    g.add_node("worker", worker)
    g.add_conditional_edges(
        START,
        lambda s: [Send("worker", {"messages": s["messages"], "angle": a}) for a in "xy"],
        ["worker"],
    )
    g.add_edge("worker", END)
    app = with_agentspec(g.compile(), config=STRICT)
    config: Any = {"configurable": {"thread_id": "chat"}}
    out = app.invoke({"messages": [HumanMessage("hi")]}, config)
    app.invoke({"messages": [*out["messages"], HumanMessage("more")]}, config)
    tags = _seen_tags(model)
    assert len(tags) == 4
    assert all(t is not None and t.group_kind == "fanout" for t in tags)


def test_fanout_routing_keeps_a_functional_agents_turns_on_one_replica() -> None:
    server = FakeOpenAI()
    model = _chat_openai(server.transport).bind_tools([lookup])
    config = TaggingConfig(adapter_raise_errors=True, routing_granularity="fanout")
    app = with_agentspec(_openai_agent(model, []), config=config, engine=URL)
    app.invoke("q")
    keys = [h["x-session-id"] for h in server.headers]
    assert len(keys) == 2
    assert keys[0] == keys[1]


def test_the_reply_index_of_a_long_thread_is_bounded() -> None:
    model = ScriptedChatModel(script=echo)

    @task
    def ask(question: str) -> AIMessage:
        return model.invoke([HumanMessage(question)])  # type: ignore[return-value]

    @entrypoint()
    def flow(question: str) -> int:
        return len([f.result() for f in [ask(f"{question}{i}") for i in range(10)]])

    app = with_agentspec(flow, config=TaggingConfig(adapter_raise_errors=True, graph_max_calls=8))
    for _ in range(30):
        app.invoke("q", {"configurable": {"thread_id": "long"}})
    handler = handler_of(app)
    query = handler._finished["thread:long"]
    assert len(query.graph.calls) == 8
    assert max(len(query.replies), len(query.calls_round), len(query.runs_round)) <= 256


def test_turns_of_a_task_making_two_calls_are_repeats() -> None:
    def script(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> AIMessage:
        if messages[-1].content != "check":
            return AIMessage(content="draft")
        return react_script(2)(messages, tools)

    model = ScriptedChatModel(script=script)

    @task
    def call_model(messages: list[BaseMessage]) -> AIMessage:
        draft = model.invoke(messages)
        return model.invoke([*messages, draft, HumanMessage("check")])  # type: ignore[return-value]

    app = with_agentspec(react_agent(call_model), config=STRICT)
    app.invoke("q")
    tags = _seen_tags(model)
    assert len(tags) == 6
    graph = handler_of(app).graph(tags[0].query_id)  # type: ignore[union-attr]
    assert graph.groups_of("fanout", min_size=2) == []
