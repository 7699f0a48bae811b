"""``vllm-router`` as ``agentspec cluster`` runs it, in front of two fake OpenAI workers (no
engine): ``consistent_hash`` keeps one routing key on one worker and spreads different
keys; ``round_robin`` alternates; two routers run side by side (each its own metrics
port); a router stops when its block ends."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentspec_mw_langgraph.routing import routing_headers
from agentspec_mw_vllm.cluster import ClusterConfig, running_router
from tests.serving import free_port
from tests.vllm.fakes import OpenAIWorker

pytest.importorskip("vllm_router")


@pytest.fixture(scope="module")
def workers() -> Iterator[list[str]]:
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), OpenAIWorker) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()


def _post(router: str, headers: dict[str, str]) -> int:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode()
    req = urllib.request.Request(
        router + "/v1/chat/completions", body, {"content-type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.loads(resp.read())["port"])


def test_consistent_hash_keeps_a_key_on_one_worker(workers: list[str], tmp_path: Path) -> None:
    with running_router(workers, tmp_path / "r.log", port=free_port()) as router:
        keys = [routing_headers("tenant", f"query-{i}") for i in range(16)]
        first = [_post(router, h) for h in keys]
        again = [_post(router, h) for h in keys]
    assert first == again  # every query keeps its replica
    assert len(set(first)) == 2  # 16 queries do not all hash to one replica


def test_round_robin_alternates_and_the_router_stops(workers: list[str], tmp_path: Path) -> None:
    port = free_port()
    with (
        running_router(workers, tmp_path / "r.log", port=port, policy="round_robin") as router,
        running_router(workers, tmp_path / "r2.log", port=free_port()),  # side by side
    ):
        key = routing_headers("tenant", "one-query")
        ports = [_post(router, key) for _ in range(6)]
    assert len(set(ports)) == 2 and all(a != b for a, b in zip(ports, ports[1:], strict=False))
    with pytest.raises(OSError):
        urllib.request.urlopen(router + "/health", timeout=2)


def test_replica_ports_follow_the_router_port() -> None:
    assert ClusterConfig(replicas=3, port=9000).replica_ports() == [9001, 9002, 9003]
    with pytest.raises(ValueError):
        ClusterConfig(replicas=0)
