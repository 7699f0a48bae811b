"""Two real ``agentspec serve`` replicas behind a real ``vllm-router`` on 127.0.0.1.

Concurrent multi-agent queries (plan -> two ``Send`` workers -> write) run through
``with_agentspec(graph, engine=router)``; each query has its own isolation scope, so each
replica's ``agentspec_scope_drafted_tokens_total{scope}`` (``--metrics-labels scope``; the
probe drafter drafts on every request) says which replicas served it. With
``consistent_hash`` every query's requests reached exactly one replica; with
``round_robin`` the requests alternate (the comparison, no affinity).
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Send

from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from tests.serving import free_port, http_get

from .graphs import fan_out_graph
from .test_engine_e2e import PROBE

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct"
QUERIES = 3
CALLS_PER_QUERY = 4  # plan, two workers, write


class QState(TypedDict, total=False):
    question: str
    topic: str
    notes: Annotated[list[str], operator.add]


def query_graph(llm: Any) -> Any:
    """plan -> two ``Send`` workers -> write: one LLM call per node run."""

    async def plan(state: QState) -> dict[str, Any]:
        await llm.ainvoke([HumanMessage(f"Plan a short answer to: {state['question']}")])
        return {}

    def dispatch(state: QState) -> list[Send]:
        return [Send("work", {"topic": f"{state['question']} (part {i})"}) for i in (1, 2)]

    async def work(state: QState) -> dict[str, Any]:
        out = await llm.ainvoke([HumanMessage(f"Write one fact about {state['topic']}")])
        return {"notes": [str(out.content)]}

    async def write(state: QState) -> dict[str, Any]:
        notes = " ".join(state.get("notes", []))
        await llm.ainvoke([HumanMessage(f"Answer {state['question']} using: {notes}")])
        return {}

    return fan_out_graph(QState, plan, dispatch, work, write)


def metric_sum(text: str, name: str, label: str = "") -> float:
    """The sum of the samples of ``name`` (whose labels contain ``label``) in a
    Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if label in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    pytest.importorskip("vllm")
    pytest.importorskip("langchain_openai")
    pytest.importorskip("vllm_router")
    from agentspec_mw_vllm.cluster import ClusterConfig, running_replicas

    serve = ["--served-model-name", MODEL, "--speculative", PROBE, "--k", "2"]
    serve += ["--max-model-len", "512", "--metrics-labels", "scope"]
    serve += ["--", "--enforce-eager", "--max-num-seqs", "8"]
    cfg = ClusterConfig(replicas=2, serve_args=tuple(serve))
    log_dir = tmp_path_factory.mktemp("cluster")
    with running_replicas(cfg, log_dir, ports=[free_port(), free_port()]) as urls:
        yield urls


def _run_queries(router: str, prefix: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=router + "/v1",
        api_key="unused",
        max_tokens=6,
        temperature=0.0,
        max_retries=0,
        timeout=300,
        http_async_client=httpx.AsyncClient(timeout=300),
    )
    apps = [
        with_agentspec(
            query_graph(llm),
            engine=router + "/v1",
            config=TaggingConfig(tags_scope=f"{prefix}{i}", adapter_raise_errors=True),
        )
        for i in range(QUERIES)
    ]

    async def main() -> None:
        await asyncio.gather(
            *(app.ainvoke({"question": f"topic {i}"}) for i, app in enumerate(apps))
        )

    asyncio.run(main())


def _served(replicas: list[str], prefix: str) -> tuple[list[list[float]], list[float]]:
    """Per query, the drafted tokens each replica counted for its scope; per replica,
    the requests vLLM finished."""
    pages = [http_get(url + "/metrics") for url in replicas]
    by_query = [
        [
            metric_sum(p, "agentspec_scope_drafted_tokens_total", f'scope="{prefix}{i}"')
            for p in pages
        ]
        for i in range(QUERIES)
    ]
    finished = [metric_sum(p, "vllm:request_success_total") for p in pages]
    return by_query, finished


@pytest.mark.parametrize(("policy", "prefix"), [("consistent_hash", "aff"), ("round_robin", "rr")])
def test_queries_through_the_router(
    replicas: list[str], policy: str, prefix: str, tmp_path: Any
) -> None:
    from agentspec_mw_vllm.cluster import running_router

    _, before = _served(replicas, prefix)
    port = free_port()
    with running_router(replicas, tmp_path / "router.log", port=port, policy=policy) as router:  # type: ignore[arg-type]
        _run_queries(router, prefix)
    by_query, after = _served(replicas, prefix)
    per_replica = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(per_replica) == QUERIES * CALLS_PER_QUERY  # every request reached a replica
    assert all(sum(d) > 0 for d in by_query), by_query  # every query drafted somewhere
    spread = [sum(x > 0 for x in d) for d in by_query]
    if policy == "consistent_hash":
        assert spread == [1] * QUERIES, by_query  # each query on exactly one replica
    else:
        assert sorted(per_replica) == [QUERIES * CALLS_PER_QUERY / 2] * 2  # requests alternate
