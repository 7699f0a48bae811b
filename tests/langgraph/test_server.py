"""The remote path on a real server: ``agentspec serve`` on 127.0.0.1 with the probe
drafter, a graph whose nodes use ``ChatOpenAI``: identical outputs with and without
``with_agentspec``, and the server's per-agent metrics show the tags arrived."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentspec_mw_langgraph import AgentSpecConfig, with_agentspec
from agentspec_mw_langgraph.openai import AgentSpecTransport
from tests.serving import http_get, running_server

from .test_engine_e2e import PROBE, build_graph

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("vllm")
    pytest.importorskip("langchain_openai")
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--served-model-name", MODEL, "--speculative", PROBE, "--k", "2"]
    args += ["--max-model-len", "768", "--", "--enforce-eager", "--max-num-seqs", "8"]
    with running_server(args, log) as base:
        yield base


def test_chat_openai_graph_on_real_server(server: str) -> None:
    from langchain_openai import ChatOpenAI

    common: dict[str, Any] = {
        "model": MODEL,
        "base_url": server + "/v1",
        "api_key": "unused",
        "max_tokens": 12,
        "temperature": 0.0,
    }
    inp = {"topic": "tea", "ideas": [], "final": ""}
    plain = build_graph(ChatOpenAI(**common)).invoke(inp)
    transport = AgentSpecTransport()
    tagged_llm = ChatOpenAI(**common, http_client=httpx.Client(transport=transport))
    app = with_agentspec(build_graph(tagged_llm), config=AgentSpecConfig(adapter_raise_errors=True))
    assert app.invoke(inp) == plain
    assert (transport.stats.injected, transport.stats.untagged) == (4, 0)
    # the same graph with plain ChatOpenAI models, tagged through engine=<base URL>
    from agentspec_mw_langgraph.openai_hook import disable_openai_injection, hook_stats

    before = hook_stats().injected
    try:
        hooked = with_agentspec(
            build_graph(ChatOpenAI(**common)),
            engine=server + "/v1",
            config=AgentSpecConfig(adapter_raise_errors=True),
        )
        assert hooked.invoke(inp) == plain
    finally:
        disable_openai_injection(server + "/v1")
    assert hook_stats().injected - before == 4
    metrics = http_get(server + "/metrics")
    for agent in ("planner", "worker", "writer"):
        assert f'agentspec_drafted_tokens_total{{agent="{agent}"' in metrics, agent
