"""Per-call speculation stats on the server path: a vLLM-shaped endpoint reports
``metrics.speculative_decoding`` per request, and each ``AIMessage`` of a graph wrapped by
``with_agentspec`` gets its own request's numbers as
``response_metadata["speculative_decoding"]`` -- through the OpenAI-SDK hook
(``engine=URL``) and through the tagging transports, sync and async, streaming or not,
with the body in one piece or in small pieces, in concurrent fan-out branches. Without the
field, or with a malformed one, the messages go without and the requests are untouched."""

from __future__ import annotations

import asyncio
import inspect
import logging
import operator
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from agentspec_mw_langgraph import TaggingConfig, get_handler, with_agentspec
from agentspec_mw_langgraph.openai import agentspec_chat_openai
from agentspec_mw_langgraph.openai_hook import hook_stats
from agentspec_mw_langgraph.spec_stats import _Tap, stats_from_body

from .fake_openai import FakeOpenAI

pytest.importorskip("langchain_openai")

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
URL = "http://127.0.0.1:9/v1"
TOPICS = ("tea", "rain", "maps")
KEY = "speculative_decoding"


def chat(server: FakeOpenAI, layer: str, **kwargs: Any) -> Any:
    """A ChatOpenAI on ``server``: tagged by the transports, or a plain one (the hook)."""
    common: dict[str, Any] = {
        "model": MODEL,
        "base_url": URL,
        "api_key": "unused",
        "max_retries": 0,
        **kwargs,
    }
    if layer == "transports":
        return agentspec_chat_openai(
            transport=server.transport, async_transport=server.transport, **common
        )
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        http_client=httpx.Client(transport=server.transport),
        http_async_client=httpx.AsyncClient(transport=server.transport),
        **common,
    )


class FanState(TypedDict):
    topics: list[str]
    answers: Annotated[list[AIMessage], operator.add]


def fanout_graph(llm: Any, use_async: bool) -> Any:
    """One branch per topic (``Send``), each asking twice in a row."""

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        t = state["topic"]
        return {"answers": [llm.invoke([HumanMessage(f"{t}-{j}")]) for j in range(2)]}

    async def aask(state: dict[str, Any]) -> dict[str, Any]:
        t = state["topic"]
        return {"answers": [await llm.ainvoke([HumanMessage(f"{t}-{j}")]) for j in range(2)]}

    g = StateGraph(FanState)
    g.add_node("ask", aask if use_async else ask)
    g.add_conditional_edges(START, lambda s: [Send("ask", {"topic": t}) for t in s["topics"]])
    g.add_edge("ask", END)
    return g.compile()


def wrapped(graph: Any, layer: str, config: TaggingConfig) -> Any:
    if layer == "transports":
        return with_agentspec(graph, config=config)
    return with_agentspec(graph, engine=URL, config=config)


def run(app: Any, use_async: bool) -> list[AIMessage]:
    inp = {"topics": list(TOPICS), "answers": []}
    out = asyncio.run(app.ainvoke(inp)) if use_async else app.invoke(inp)
    answers: list[AIMessage] = out["answers"]
    return answers


def expected(server: FakeOpenAI) -> dict[str, dict[str, int]]:
    """The stats the server sent, by the answer text of the request."""
    return {
        f"answer: {body['messages'][0]['content']}": server.expected_stats(i)
        for i, body in enumerate(server.bodies)
    }


def _text(message: AIMessage) -> str:
    return str(message.content).strip()


@pytest.mark.parametrize("layer", ["hook", "transports"])
@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 7])
def test_each_message_gets_its_requests_stats(
    layer: str, use_async: bool, streaming: bool, chunk_bytes: int | None, strict: TaggingConfig
) -> None:
    server = FakeOpenAI(spec_decoding=True, chunk_bytes=chunk_bytes)
    stream_kw = {"streaming": True, "stream_usage": True} if streaming else {}
    app = wrapped(fanout_graph(chat(server, layer, **stream_kw), use_async), layer, strict)
    answers = run(app, use_async)
    assert len(answers) == 2 * len(TOPICS) == len(server.bodies)
    assert all(bool(b.get("stream")) == streaming for b in server.bodies)
    want = expected(server)
    assert len(set(map(str, want.values()))) == len(answers)  # every request its own numbers
    for message in answers:
        assert message.response_metadata[KEY] == want[_text(message)], _text(message)
    stats = get_handler(app).stats  # type: ignore[union-attr]
    assert (stats.tags_derived, stats.tags_delivered, stats.adapter_errors) == (6, 6, 0)


@pytest.mark.parametrize("layer", ["hook", "transports"])
@pytest.mark.parametrize("use_async", [False, True])
def test_streamed_usage_chunk_carries_the_stats(
    layer: str, use_async: bool, strict: TaggingConfig
) -> None:
    """``stream_mode="messages"``: the usage chunk of each call carries its stats (and so
    the message merged from the chunks); no other chunk does."""
    server = FakeOpenAI(spec_decoding=True, chunk_bytes=13)
    llm = chat(server, layer, streaming=True, stream_usage=True)
    app = wrapped(fanout_graph(llm, use_async), layer, strict)
    inp = {"topics": list(TOPICS), "answers": []}

    async def collect() -> list[Any]:
        return [part async for part in app.astream(inp, stream_mode="messages")]

    parts = asyncio.run(collect()) if use_async else list(app.stream(inp, stream_mode="messages"))
    merged: dict[str, Any] = {}
    for chunk, _ in parts:
        merged[chunk.id] = merged[chunk.id] + chunk if chunk.id in merged else chunk
        if KEY in chunk.response_metadata:
            assert chunk.usage_metadata is not None and chunk.content == ""
    want = expected(server)
    assert len(merged) == 6 == len(want)
    for message in merged.values():
        assert message.response_metadata[KEY] == want[_text(message)], _text(message)
    assert sum(KEY in chunk.response_metadata for chunk, _ in parts) == 6


@pytest.mark.parametrize("layer", ["hook", "transports"])
def test_without_metrics_the_messages_go_without(layer: str, strict: TaggingConfig) -> None:
    server = FakeOpenAI(chunk_bytes=5)
    before = hook_stats()
    answers = run(wrapped(fanout_graph(chat(server, layer), False), layer, strict), False)
    assert len(answers) == 6 and all(KEY not in m.response_metadata for m in answers)
    after = hook_stats()
    assert (after.stats_read, after.stats_errors) == (before.stats_read, before.stats_errors)


@pytest.mark.parametrize("layer", ["hook", "transports"])
def test_streaming_without_usage_gets_no_stats(layer: str, strict: TaggingConfig) -> None:
    """vLLM sends the stats on the usage chunk only: ``stream_usage=True`` is needed."""
    server = FakeOpenAI(spec_decoding=True)
    llm = chat(server, layer, streaming=True, stream_usage=False)
    answers = run(wrapped(fanout_graph(llm, False), layer, strict), False)
    assert "stream_options" not in server.bodies[0]
    assert len(answers) == 6 and all(KEY not in m.response_metadata for m in answers)


@pytest.mark.parametrize("layer", ["hook", "transports"])
@pytest.mark.parametrize("streaming", [False, True])
def test_malformed_metrics_leave_the_call_alone(
    layer: str,
    streaming: bool,
    strict: TaggingConfig,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentspec_mw_langgraph import spec_stats

    monkeypatch.setattr(spec_stats, "_warned", False)
    server = FakeOpenAI(spec_decoding=True, chunk_bytes=11)
    server.metrics_override = {KEY: {"num_draft_tokens": "many", "num_accepted_draft_tokens": 1}}
    llm = chat(server, layer, **({"streaming": True, "stream_usage": True} if streaming else {}))
    if layer == "transports":
        transport = llm.http_client._transport
    before = hook_stats().stats_errors
    with caplog.at_level(logging.WARNING):
        answers = run(wrapped(fanout_graph(llm, False), layer, strict), False)
    assert sorted(map(_text, answers)) == sorted(expected(server))  # answers unharmed
    assert all(KEY not in m.response_metadata for m in answers)
    errors = transport.stats.stats_errors if layer == "transports" else hook_stats().stats_errors
    assert errors - (0 if layer == "transports" else before) == 6
    warned = [r for r in caplog.records if r.name == spec_stats.__name__]
    assert len(warned) == 1 and "num_draft_tokens" in warned[0].getMessage()


@pytest.fixture()
def http_server() -> Iterator[tuple[FakeOpenAI, str]]:
    """The fake endpoint behind a real HTTP server on 127.0.0.1 (for clients built with
    the OpenAI SDK's own defaults, whose transport cannot be swapped)."""
    fake = FakeOpenAI(spec_decoding=True)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["content-length"]))
            request = httpx.Request("POST", "http://fake" + self.path, content=body)
            response = fake.transport.handle_request(request)
            data = response.read()
            self.send_response(response.status_code)
            self.send_header("content-type", response.headers["content-type"])
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
def test_default_sdk_clients_over_http(
    http_server: tuple[FakeOpenAI, str], use_async: bool, streaming: bool, strict: TaggingConfig
) -> None:
    """A plain ChatOpenAI with the SDK's default HTTP clients, over a real socket."""
    from langchain_openai import ChatOpenAI

    fake, url = http_server
    stream_kw = {"streaming": True, "stream_usage": True} if streaming else {}
    llm = ChatOpenAI(model=MODEL, base_url=url, api_key="unused", max_retries=0, **stream_kw)
    app = with_agentspec(fanout_graph(llm, use_async), engine=url, config=strict)
    inp = {"topics": list(TOPICS), "answers": []}

    async def arun() -> dict[str, Any]:
        try:
            out: dict[str, Any] = await app.ainvoke(inp)
            return out
        finally:  # its sockets belong to this event loop
            await llm.root_async_client.close()

    answers = asyncio.run(arun())["answers"] if use_async else app.invoke(inp)["answers"]
    llm.root_client.close()
    want = expected(fake)
    assert len(answers) == 6 and len(want) == 6
    for message in answers:
        assert message.response_metadata[KEY] == want[_text(message)], _text(message)


def test_calls_outside_a_wrapped_graph_get_no_stats(strict: TaggingConfig) -> None:
    server = FakeOpenAI(spec_decoding=True)
    llm = chat(server, "hook")
    wrapped(fanout_graph(llm, False), "hook", strict)  # the hook is installed
    assert KEY not in llm.invoke("outside").response_metadata
    assert KEY not in chat(server, "transports").invoke("outside").response_metadata
    assert len(server.bodies) == 2 and all("metrics" not in b for b in server.bodies)


def test_response_hook_point_contract(strict: TaggingConfig) -> None:
    from openai._base_client import AsyncAPIClient, SyncAPIClient

    with_agentspec(fanout_graph(chat(FakeOpenAI(), "hook"), False), engine=URL, config=strict)
    assert hook_stats().stats_hooked
    for cls in (SyncAPIClient, AsyncAPIClient):
        params = list(inspect.signature(cls._send_request).parameters)
        assert params[:3] == ["self", "request", "stream"], cls
    assert inspect.iscoroutinefunction(AsyncAPIClient._send_request)


SSE = (
    b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    b'data: {"choices": [], "metrics": {"speculative_decoding": '
    b'{"num_draft_tokens": 8, "num_accepted_draft_tokens": 3, "num_spec_steps": 4}}}\r\n\r\n'
    b"data: [DONE]\n\n"
)


def test_sse_tap_finds_the_stats_whatever_the_chunking() -> None:
    for size in range(1, len(SSE) + 1):
        found: list[dict[str, int]] = []
        tap = _Tap(True, found.append, pytest.fail)
        for i in range(0, len(SSE), size):
            tap.feed(SSE[i : i + size])
        tap.finish()
        assert found == [{"num_draft_tokens": 8, "num_accepted_draft_tokens": 3}], size


def test_stats_from_body() -> None:
    spec = {"num_draft_tokens": 4, "num_accepted_draft_tokens": 0, "draft_acceptance_rate": 0}
    assert stats_from_body({"metrics": {KEY: spec}}) == {
        "num_draft_tokens": 4,
        "num_accepted_draft_tokens": 0,
    }
    assert stats_from_body({"metrics": {"time_to_first_token_ms": 1.0}}) is None
    assert stats_from_body({"choices": []}) is None
    for bad in (
        {"num_draft_tokens": 4},
        {**spec, "num_draft_tokens": -1},
        [],
        {**spec, "num_draft_tokens": True},
    ):
        with pytest.raises(ValueError):
            stats_from_body({"metrics": {KEY: bad}})
