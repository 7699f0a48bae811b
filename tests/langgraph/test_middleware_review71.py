"""Review 71 of ``AgentSpecMiddleware`` and the tagging httpx clients: tags only for the
``engine=`` server, the response format's tool, model swaps inside the middleware,
client options and proxies, agent names, a user's client, copies of the middleware."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import pickle
import ssl
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import BaseModel

from agentspec_mw.tags import StructureTags, tags_from_wire
from agentspec_mw_langgraph import AgentSpecMiddleware, TaggingConfig, with_agentspec
from agentspec_mw_langgraph.context import set_current_tags
from agentspec_mw_langgraph.openai import (
    AgentSpecAsyncTransport,
    AgentSpecTransport,
    agentspec_chat_openai,
    agentspec_http_clients,
)

from .fake_chat import ScriptedChatModel
from .fake_openai import FakeOpenAI

pytest.importorskip("langchain_openai")

URL = "http://127.0.0.1:9/v1"
OPENAI = "https://api.openai.com/v1"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
HEADER = "x-session-id"
TAGS = StructureTags(scope="s", agent_id="a", query_id="q", segment="answer")


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


class Answer(BaseModel):
    query: str


class Failing(FakeOpenAI):
    """Records each request and answers 500."""

    def _handle(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self._bodies.append(json.loads(request.read()))
            self._headers.append({k.lower(): v for k, v in request.headers.items()})
        return httpx.Response(500, json={"error": {"message": "boom"}})


KWARGS: list[list[str]] = []


class Recording(ScriptedChatModel):
    """A non-OpenAI model that records the keyword arguments of each call."""

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        KWARGS.append(sorted(kw))
        return super()._generate(messages, stop, run_manager, **kw)


def chat_openai(server: FakeOpenAI, base_url: str | None = URL, **kwargs: Any) -> Any:
    from langchain_openai import ChatOpenAI

    kwargs.setdefault("model", MODEL)
    if base_url is not None:
        kwargs["base_url"] = base_url
    return ChatOpenAI(
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(transport=server.transport),
        http_async_client=httpx.AsyncClient(transport=server.transport),
        **kwargs,
    )


def _wire(server: FakeOpenAI) -> list[Any]:
    return [b.get("vllm_xargs") for b in server.bodies]


def _run(agent: Any, text: str = "q", mode: str = "sync", config: Any = None) -> Any:
    inp = {"messages": [HumanMessage(text)]}
    if mode == "sync":
        return agent.invoke(inp, config)
    return asyncio.run(agent.ainvoke(inp, config))


# ----------------------------------------------- 1: tags only for the engine= server
@pytest.mark.parametrize("engine", [None, URL])
@pytest.mark.parametrize("order", ["agentspec_outer", "agentspec_inner"])
def test_a_fallback_to_a_hosted_api_goes_untagged(order: str, engine: str | None) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelFallbackMiddleware

    primary_server, openai_server = Failing(), FakeOpenAI()
    fallback = chat_openai(openai_server, base_url=OPENAI, model="gpt-4o-mini")
    middleware: list[Any] = [AgentSpecMiddleware(engine=engine), ModelFallbackMiddleware(fallback)]
    if order == "agentspec_inner":
        middleware.reverse()
    agent = create_agent(chat_openai(primary_server), [search], middleware=middleware)
    out = _run(agent)
    assert out["messages"][-1].content == "answer: q"
    assert all(w is not None for w in _wire(primary_server))
    assert len(openai_server.bodies) == 2
    assert _wire(openai_server) == [None, None]
    assert [h.get(HEADER) for h in openai_server.headers] == [None, None]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_engine_is_matched_as_with_agentspec_matches_it(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    same = AgentSpecMiddleware(engine="http://localhost:9/")  # 127.0.0.1:9/v1: one server
    _run(create_agent(chat_openai(server), [], middleware=[same]), mode=mode)
    assert tags_from_wire(server.bodies[0]["vllm_xargs"]) is not None
    assert server.headers[0].get(HEADER)
    other = AgentSpecMiddleware(engine="http://127.0.0.1:8000/v1")
    agent = create_agent(chat_openai(server), [], middleware=[other])
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.middleware"):
        _run(agent, mode=mode)
        _run(agent, mode=mode)
    assert _wire(server)[1:] == [None, None]
    assert [h.get(HEADER) for h in server.headers[1:]] == [None, None]
    warned = [r.getMessage() for r in caplog.records if "not the engine= server" in r.getMessage()]
    assert len(warned) == 1 and "127.0.0.1:9" in warned[0]  # once per server
    stats = other.stats
    assert (stats.model_calls, stats.tags_derived, stats.tags_delivered) == (2, 0, 0)


def test_without_engine_it_warns_once_and_skips_models_without_a_server(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain.agents import create_agent

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    server, default = FakeOpenAI(), FakeOpenAI()
    middleware = AgentSpecMiddleware()
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.middleware"):
        agent = create_agent(chat_openai(server), [], middleware=[middleware])
        _run(agent)
        _run(agent)
        # no base_url: the OpenAI API itself
        _run(create_agent(chat_openai(default, base_url=None), [], middleware=[middleware]))
    assert all(w is not None for w in _wire(server))
    assert _wire(default) == [None]
    hints = [r.getMessage() for r in caplog.records if "has no engine=" in r.getMessage()]
    assert len(hints) == 1 and "engine='http://127.0.0.1:9/v1'" in hints[0]


@pytest.mark.parametrize(
    ("base_url", "tagged"),
    [
        ("http://10.0.3.7:8000/v1", True),
        ("http://192.168.1.20:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://100.101.7.3:8000/v1", True),  # an overlay network's (shared) address
        ("http://[fd7a:115c:a1e0::1]:8000/v1", True),  # an IPv6 unique local address
        ("http://vllm:8000/v1", True),  # a Compose or Kubernetes service name
        ("http://vllm.default.svc.cluster.local:8000/v1", True),
        ("http://gpu-box.local:8000/v1", True),
        ("http://host.docker.internal:8000/v1", True),
        ("https://llm-gateway.example.com/v1", False),  # a gateway: maybe a hosted API's
        ("https://api.groq.com/openai/v1", False),
        ("https://openrouter.ai/api/v1", False),
        ("https://my-resource.openai.azure.com/openai/v1", False),
        ("http://34.120.1.5:8000/v1", False),  # a public address
    ],
)
def test_without_engine_only_a_server_on_a_private_network_is_tagged(
    base_url: str, tagged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    middleware = AgentSpecMiddleware()
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_langgraph.middleware"):
        _run(create_agent(chat_openai(server, base_url=base_url), [], middleware=[middleware]))
    assert (_wire(server)[0] is not None) is tagged
    assert (server.headers[0].get(HEADER) is not None) is tagged
    (warning,) = [r.getMessage() for r in caplog.records]
    assert ("has no engine=" if tagged else "go without tags") in warning
    assert f"engine={base_url!r}" in warning


def test_engine_argument() -> None:
    server = FakeOpenAI()
    assert AgentSpecMiddleware(engine=chat_openai(server)).engine == "http://localhost:9"
    assert AgentSpecMiddleware(engine="http://127.0.0.1:9/v1/").engine == "http://localhost:9"
    with pytest.raises(ValueError, match="not a server URL"):
        AgentSpecMiddleware(engine="localhost:8000")
    with pytest.raises(TypeError, match="engine= must be the vLLM server's OpenAI base URL"):
        AgentSpecMiddleware(engine=8000)


# --------------------------------------- 2: the response format's tool and tool_choice
@pytest.mark.parametrize("strategy", ["tool", "auto"])
@pytest.mark.parametrize("with_tools", [False, True])
def test_structured_output_tool_is_a_tool_call(strategy: str, with_tools: bool) -> None:
    from langchain.agents import create_agent
    from langchain.agents.structured_output import ToolStrategy

    fmt: Any = ToolStrategy(Answer) if strategy == "tool" else Answer
    tools = [search] if with_tools else []
    mw_server, wrap_server = FakeOpenAI(), FakeOpenAI()
    mw = create_agent(
        chat_openai(mw_server), tools, response_format=fmt, middleware=[AgentSpecMiddleware()]
    )
    _run(mw)
    wrapped = with_agentspec(
        create_agent(chat_openai(wrap_server), tools, response_format=fmt), engine=URL
    )
    _run(wrapped)
    assert all(b["tool_choice"] == "required" for b in mw_server.bodies)  # forced
    got = [tags_from_wire(w) for w in _wire(mw_server)]
    want = [tags_from_wire(w) for w in _wire(wrap_server)]
    assert [(t.segment, t.blocks) for t in got] == [(t.segment, t.blocks) for t in want]  # type: ignore[union-attr]
    assert {t.segment for t in got} == {"tool_call"}  # type: ignore[union-attr]
    assert all(t.blocks for t in got)  # type: ignore[union-attr]  # Qwen with a tool


def test_provider_structured_output_adds_no_tool() -> None:
    from langchain.agents.middleware import ModelRequest
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy

    middleware = AgentSpecMiddleware()

    def segment(fmt: Any) -> str:
        request: Any = ModelRequest(
            model=chat_openai(FakeOpenAI()),
            messages=[HumanMessage("q")],
            response_format=fmt,
            state={"messages": [], "agentspec_query": "run:1"},
        )
        return middleware.tags_for(request).segment  # type: ignore[return-value]

    assert segment(ProviderStrategy(Answer)) == "answer"
    assert segment(ToolStrategy(Answer)) == "tool_call"
    assert segment(None) == "answer"


# ----------------------------------- 3: what the middleware inside it does to the call
def test_a_model_swapped_in_inside_gets_no_openai_arguments() -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    other = Recording(script=lambda messages, tools: AIMessage("done"))

    @wrap_model_call
    def to_other(request: Any, handler: Any) -> Any:
        return handler(request.override(model=other))

    server = FakeOpenAI()
    llm = chat_openai(server)
    KWARGS.clear()
    create_agent(llm, [], middleware=[AgentSpecMiddleware(), to_other]).invoke(
        {"messages": [HumanMessage("q")]}
    )
    assert KWARGS == [[]]
    assert llm.extra_body is None and not llm.model_kwargs  # the user's model is unchanged


def test_a_selector_models_calls_inside_get_no_tags() -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import LLMToolSelectorMiddleware

    class Selector(FakeOpenAI):
        @staticmethod
        def _answer(body: dict[str, Any]) -> dict[str, Any]:
            return {"role": "assistant", "content": json.dumps({"tools": ["search"]})}

    @tool
    def other(query: str) -> str:
        """Other."""
        return "x"

    selector_server, server = Selector(), FakeOpenAI()
    selector = agentspec_chat_openai(
        model="Qwen/sel",
        base_url="http://127.0.0.1:9999/v1",
        api_key="x",
        max_retries=0,
        transport=selector_server.transport,
        async_transport=selector_server.transport,
    )
    middleware = [AgentSpecMiddleware(), LLMToolSelectorMiddleware(model=selector, max_tools=1)]
    create_agent(chat_openai(server), [search, other], middleware=middleware).invoke(
        {"messages": [HumanMessage("q")]}
    )
    assert len(selector_server.bodies) == 2
    assert _wire(selector_server) == [None, None]
    assert [tags_from_wire(w).segment for w in _wire(server)] == ["tool_call", "answer"]  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_last_it_tags_the_model_that_goes_out(mode: str) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    server = FakeOpenAI()
    vllm = chat_openai(server)

    @wrap_model_call
    def to_vllm(request: Any, handler: Any) -> Any:
        return handler(request.override(model=vllm))

    @wrap_model_call
    async def ato_vllm(request: Any, handler: Any) -> Any:
        return await handler(request.override(model=vllm))

    scripted = ScriptedChatModel(script=lambda messages, tools: AIMessage("done"))
    swap = to_vllm if mode == "sync" else ato_vllm
    _run(create_agent(scripted, [], middleware=[swap, AgentSpecMiddleware()]), mode=mode)
    assert tags_from_wire(server.bodies[0]["vllm_xargs"]) is not None
    assert server.headers[0].get(HEADER)
    assert scripted.seen == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_extra_body_and_headers_already_in_the_settings_get_the_tags(mode: str) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def settings(request: Any, handler: Any) -> Any:
        extra = {"extra_body": {"top_k": 5}, "extra_headers": {"x-mine": "1"}}
        return handler(request.override(model_settings=extra))

    @wrap_model_call
    async def asettings(request: Any, handler: Any) -> Any:
        extra = {"extra_body": {"top_k": 5}, "extra_headers": {"x-mine": "1"}}
        return await handler(request.override(model_settings=extra))

    server = FakeOpenAI()
    first = settings if mode == "sync" else asettings
    _run(
        create_agent(chat_openai(server), [], middleware=[first, AgentSpecMiddleware()]), mode=mode
    )
    body, headers = server.bodies[0], server.headers[0]
    assert body["top_k"] == 5 and tags_from_wire(body["vllm_xargs"]) is not None
    assert headers["x-mine"] == "1" and headers.get(HEADER)


# ----------------------------------------------- 4: client options, proxies, mounts
def _pool(transport: Any) -> Any:
    assert isinstance(transport, AgentSpecTransport | AgentSpecAsyncTransport)
    return transport._inner._pool


def test_client_options_reach_the_transport() -> None:
    sync, async_ = agentspec_http_clients(limits=httpx.Limits(max_connections=3), verify=False)
    for client in (sync, async_):
        pool = _pool(client._transport)
        assert pool._max_connections == 3
        assert pool._ssl_context.verify_mode == ssl.CERT_NONE


def test_proxies_are_used_and_tagged(monkeypatch: pytest.MonkeyPatch) -> None:
    url = httpx.URL("https://vllm.example/v1/chat/completions")
    for client in agentspec_http_clients(proxy="http://proxy.example:3128"):
        assert type(_pool(client._transport_for_url(url))).__name__.endswith("HTTPProxy")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "direct.example")
    for client in agentspec_http_clients():
        assert type(_pool(client._transport_for_url(url))).__name__.endswith("HTTPProxy")
        direct = client._transport_for_url(httpx.URL("https://direct.example/v1"))
        assert direct is client._transport
        assert not type(_pool(direct)).__name__.endswith("HTTPProxy")
    for client in agentspec_http_clients(trust_env=False):
        assert not type(_pool(client._transport_for_url(url))).__name__.endswith("HTTPProxy")


def test_a_mounted_transport_tags_requests() -> None:
    server = FakeOpenAI()
    sync, async_ = agentspec_http_clients(mounts={"http://vllm.test": server.transport})
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    set_current_tags(TAGS, None)
    try:
        sync.post("http://vllm.test/v1/chat/completions", json=body)
        asyncio.run(async_.post("http://vllm.test/v1/chat/completions", json=body))
    finally:
        set_current_tags(None, None)
    assert [tags_from_wire(w) for w in _wire(server)] == [TAGS, TAGS]
    assert sync._transport.stats.injected == async_._transport.stats.injected == 1  # type: ignore[attr-defined]


# ----------------------------------------------------------- 5: create_agent(name=...)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_named_agents_are_their_names(mode: str) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    planner = create_agent(
        chat_openai(server), [], name="planner", middleware=[AgentSpecMiddleware()]
    )
    coder = create_agent(chat_openai(server), [], name="coder", middleware=[AgentSpecMiddleware()])
    unnamed = create_agent(chat_openai(server), [], middleware=[AgentSpecMiddleware()])

    @tool
    async def ask(query: str) -> str:
        """Ask the team."""
        for agent in (planner, coder, unnamed):
            await agent.ainvoke({"messages": [HumanMessage(agent.name + " " + query)]})
        return "done"

    @tool
    def ask_sync(query: str) -> str:
        """Ask the team."""
        for agent in (planner, coder, unnamed):
            agent.invoke({"messages": [HumanMessage(agent.name + " " + query)]})
        return "done"

    supervisor = create_agent(
        chat_openai(server),
        [ask_sync if mode == "sync" else ask],
        name="supervisor",
        middleware=[AgentSpecMiddleware()],
        checkpointer=InMemorySaver(),
    )
    _run(supervisor, mode=mode, config={"configurable": {"thread_id": "T"}})
    agents = [
        (b["messages"][0]["content"], b["vllm_xargs"]["agentspec_agent"]) for b in server.bodies
    ]
    assert agents[:4] == [
        ("q", "supervisor"),
        ("planner q", "tools/planner"),
        ("coder q", "tools/coder"),
        ("LangGraph q", "tools/supervisor"),  # inherits the name, not the supervisor's id
    ]
    assert agents[4] == ("q", "supervisor")


def test_a_named_agent_as_its_own_node_and_explicit_agent() -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    researcher = create_agent(
        chat_openai(server), [], name="researcher", middleware=[AgentSpecMiddleware()]
    )
    writer = create_agent(
        chat_openai(server), [], name="writer", middleware=[AgentSpecMiddleware(agent="pen")]
    )
    g = StateGraph(MessagesState)
    g.add_node(researcher)  # the node is named after the agent
    g.add_node("write", writer)
    g.add_edge(START, "researcher")
    g.add_edge("researcher", "write")
    g.add_edge("write", END)
    g.compile().invoke({"messages": [HumanMessage("q")]})
    assert [w["agentspec_agent"] for w in _wire(server)] == ["researcher", "pen"]


# ---------------------------------------------- 6: a user's client; copies of the middleware
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chat_openai_keeps_a_users_client(mode: str) -> None:
    server = FakeOpenAI()
    seen: list[str] = []

    def hook(request: httpx.Request) -> None:
        seen.append("sync")

    async def ahook(request: httpx.Request) -> None:
        seen.append("async")

    llm = agentspec_chat_openai(
        model=MODEL,
        base_url=URL,
        api_key="x",
        max_retries=0,
        http_client=httpx.Client(transport=server.transport, event_hooks={"request": [hook]}),
        http_async_client=httpx.AsyncClient(
            transport=server.transport, event_hooks={"request": [ahook]}
        ),
    )
    set_current_tags(TAGS, None)
    try:
        llm.invoke("q") if mode == "sync" else asyncio.run(llm.ainvoke("q"))
    finally:
        set_current_tags(None, None)
    assert seen == [mode]
    assert tags_from_wire(server.bodies[0]["vllm_xargs"]) == TAGS


def test_chat_openai_client_errors() -> None:
    server = FakeOpenAI()
    with pytest.raises(TypeError, match="http_client= or transport=, not both"):
        agentspec_chat_openai(
            model=MODEL,
            api_key="x",
            http_client=httpx.Client(),
            transport=server.transport,
        )
    with pytest.raises(TypeError, match="http_async_client= must be an AsyncClient"):
        agentspec_chat_openai(model=MODEL, api_key="x", http_async_client=httpx.Client())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_the_middleware_copies(how: str) -> None:
    from langchain.agents import create_agent

    server = FakeOpenAI()
    middleware = AgentSpecMiddleware(TaggingConfig(tags_scope="t"))
    create_agent(chat_openai(server), [], middleware=[middleware]).invoke(
        {"messages": [HumanMessage("q")]}
    )
    clone = (
        copy.deepcopy(middleware) if how == "deepcopy" else pickle.loads(pickle.dumps(middleware))
    )
    assert clone._lock is not middleware._lock
    assert clone.config == middleware.config and clone.stats == middleware.stats
    create_agent(chat_openai(server), [], middleware=[clone]).invoke(
        {"messages": [HumanMessage("q")]}
    )
    assert (clone.stats.tags_delivered, middleware.stats.tags_delivered) == (2, 1)
    assert tags_from_wire(server.bodies[1]["vllm_xargs"]).scope == "t"  # type: ignore[union-attr]


def test_engine_may_be_a_chat_model_whose_url_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OPENAI_BASE_URL`` sets the SDK client's URL, not ``openai_api_base``: ``engine=``
    reads the URL the model's requests go to, as requests are matched."""
    from langchain_openai import ChatOpenAI

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    model = ChatOpenAI(model="m", api_key="unused")
    assert (
        AgentSpecMiddleware(engine=model).engine
        == AgentSpecMiddleware(engine="http://127.0.0.1:8000/v1").engine
    )
