"""The remote path on a real server: ``agentspec serve`` on 127.0.0.1 with the probe
drafter. A graph whose nodes use ``ChatOpenAI``: identical outputs with and without
``with_agentspec``, and the server's per-agent metrics show the tags arrived. And
``create_agent`` with a real local tool, out of the box: the server parses the model's
tool call, the tool runs, and the requests carried the tags (``with_agentspec`` with the
server's URL written differently, then ``AgentSpecMiddleware``). With ``with_agentspec``
each ``AIMessage`` carries the server's per-call speculation stats, streaming or not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agentspec_mw_langgraph import (
    AgentSpecMiddleware,
    TaggingConfig,
    get_handler,
    with_agentspec,
)
from agentspec_mw_langgraph.openai import AgentSpecTransport
from agentspec_mw_langgraph.openai_hook import hook_stats
from tests.serving import http_get, running_server

from .test_engine_e2e import PROBE, build_graph

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct"
STRICT = TaggingConfig(adapter_raise_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("vllm")
    pytest.importorskip("langchain_openai")
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--served-model-name", MODEL, "--speculative", PROBE, "--k", "2"]
    args += ["--max-model-len", "768", "--", "--enforce-eager", "--max-num-seqs", "8"]
    with running_server(args, log) as base:
        yield base


def _common(server: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "base_url": server + "/v1",
        "api_key": "unused",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "max_retries": 0,
    }


def test_chat_openai_graph_on_real_server(server: str) -> None:
    from langchain_openai import ChatOpenAI

    common = _common(server, 12)
    inp = {"topic": "tea", "ideas": [], "final": ""}
    plain = build_graph(ChatOpenAI(**common)).invoke(inp)
    transport = AgentSpecTransport()
    tagged_llm = ChatOpenAI(**common, http_client=httpx.Client(transport=transport))
    app = with_agentspec(build_graph(tagged_llm), config=STRICT)
    assert app.invoke(inp) == plain
    assert (transport.stats.injected, transport.stats.untagged) == (4, 0)
    # the same graph with plain ChatOpenAI models, tagged through engine=<base URL>
    before = hook_stats().injected
    hooked = with_agentspec(build_graph(ChatOpenAI(**common)), engine=server, config=STRICT)
    assert hooked.invoke(inp) == plain
    assert hook_stats().injected - before == 4
    metrics = http_get(server + "/metrics")
    for agent in ("planner", "worker", "writer"):
        assert f'agentspec_drafted_tokens_total{{agent="{agent}"' in metrics, agent


PLACES: list[str] = []


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    PLACES.append(city)
    return f"rain, 12 C in {city}"


# One earlier exchange shows the tiny default model the calling convention (it does not
# call tools unprompted); the question after it gets a real tool call, greedy.
FEW_SHOT: list[BaseMessage] = [
    HumanMessage("What is the weather in Rome?"),
    AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Rome"}, "id": "c1"}]),
    ToolMessage("sunny", tool_call_id="c1"),
    AIMessage("It is sunny in Rome."),
    HumanMessage("What is the weather in Paris?"),
]


def _weather_agent(server: str, middleware: list[Any]) -> Any:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelCallLimitMiddleware
    from langchain_openai import ChatOpenAI

    limit = ModelCallLimitMiddleware(run_limit=2, exit_behavior="end")  # call, then answer
    return create_agent(
        ChatOpenAI(**_common(server, 40)), [get_weather], middleware=[*middleware, limit]
    )


def _check_tool_ran(out: dict[str, Any]) -> None:
    new = out["messages"][len(FEW_SHOT) :]
    assert isinstance(new[0], AIMessage)
    assert [(c["name"], c["args"]) for c in new[0].tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert isinstance(new[1], ToolMessage) and new[1].content == "rain, 12 C in Paris"
    assert len(new) == 3 and isinstance(new[2], AIMessage)  # the answer after the tool


def _check_spec_stats(message: BaseMessage) -> None:
    stats = message.response_metadata["speculative_decoding"]
    assert set(stats) == {"num_draft_tokens", "num_accepted_draft_tokens"}
    assert 0 <= stats["num_accepted_draft_tokens"] <= stats["num_draft_tokens"]
    assert stats["num_draft_tokens"] > 0  # the probe drafts k = 2 tokens every step


def test_create_agent_with_tools_on_real_server(server: str) -> None:
    PLACES.clear()
    engine = server.replace("127.0.0.1", "localhost")  # no /v1, another host name: same server
    app = with_agentspec(_weather_agent(server, []), engine=engine, config=STRICT)
    out = app.invoke({"messages": FEW_SHOT})
    _check_tool_ran(out)
    for message in out["messages"][len(FEW_SHOT) :: 2]:  # the tool call, the answer
        _check_spec_stats(message)
    assert PLACES == ["Paris"]
    stats = get_handler(app).stats  # type: ignore[union-attr]
    assert (stats.llm_calls, stats.tags_derived, stats.tags_delivered) == (2, 2, 2)
    assert 'agentspec_drafted_tokens_total{agent="model"' in http_get(server + "/metrics")


def test_streaming_call_gets_spec_stats_on_real_server(server: str) -> None:
    """vLLM sends the stats on the usage chunk: ``stream_usage=True``."""
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph

    llm = ChatOpenAI(**_common(server, 12), streaming=True, stream_usage=True)

    def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = with_agentspec(g.compile(), engine=server, config=STRICT)
    out = app.invoke({"messages": [HumanMessage("Name a colour.")]})
    _check_spec_stats(out["messages"][-1])
    inp = {"messages": [HumanMessage("Name a fruit.")]}
    chunks = [c for c, _ in app.stream(inp, stream_mode="messages")]
    with_stats = [c for c in chunks if "speculative_decoding" in c.response_metadata]
    assert len(with_stats) == 1 and with_stats[0].usage_metadata is not None
    _check_spec_stats(with_stats[0])


def test_create_agent_middleware_on_real_server(server: str) -> None:
    PLACES.clear()
    middleware = AgentSpecMiddleware(TaggingConfig(tags_scope="mw"))
    _check_tool_ran(_weather_agent(server, [middleware]).invoke({"messages": FEW_SHOT}))
    assert PLACES == ["Paris"]
    assert (middleware.stats.tags_derived, middleware.stats.tags_delivered) == (2, 2)
