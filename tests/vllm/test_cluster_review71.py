"""Review 71 of ``agentspec cluster`` (and ``agentspec serve``'s port check): IPv6 hosts.

``--host ::`` or ``::1`` gave health-check and worker URLs without brackets
(``http://:::8001/health``) and probed ports with IPv4 sockets (which cannot bind an IPv6
address); IPv4 hosts and the default stay as they were. Fake replicas (a small HTTP
server answering ``/health``) stand in for ``agentspec serve``: no engine starts.
"""

from __future__ import annotations

import socket
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentspec_mw_vllm.cluster as cluster
from agentspec_mw_vllm.cluster import ClusterConfig, running_replicas
from agentspec_mw_vllm.serve import port_taken
from tests.vllm.fakes import OpenAIWorker


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _ipv6(), reason="no IPv6 loopback here")
HOSTS = [
    "127.0.0.1",
    "0.0.0.0",
    pytest.param("::1", marks=needs_ipv6),
    pytest.param("::", marks=needs_ipv6),
]
URL_HOSTS = {"127.0.0.1": "127.0.0.1", "0.0.0.0": "0.0.0.0", "::1": "[::1]", "::": "[::]"}


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _free_port(host: str) -> int:
    with socket.socket(_family(host)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    host = request.param
    with socket.socket(_family(host)) as s:
        s.bind((host, 0))
        s.listen()
        yield host, int(s.getsockname()[1])


@pytest.mark.parametrize("host", [*HOSTS, "localhost"])
def test_a_free_port_is_free_on_every_kind_of_host(host: str) -> None:
    port = _free_port("::" if ":" in host else "0.0.0.0")
    assert port_taken(host, port) is None
    assert isinstance(cluster._free_port(host), int)


@pytest.mark.parametrize("listener", HOSTS, indirect=True)
def test_a_taken_port_is_in_use_on_every_kind_of_host(listener: tuple[str, int]) -> None:
    host, port = listener
    assert port_taken(host, port) == "is in use"


_REPLICA = """
import http.server, socket, sys
class Server(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
Server((sys.argv[1], int(sys.argv[2])), Health).serve_forever()
"""


@pytest.mark.parametrize("host", HOSTS)
def test_replicas_on_every_kind_of_host_are_healthy_at_their_urls(
    host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def argv(cfg: ClusterConfig, port: int) -> list[str]:
        return [sys.executable, "-c", _REPLICA, cfg.host, str(port)]

    monkeypatch.setattr(cluster, "_serve_argv", argv)
    port = _free_port(host)
    cfg = ClusterConfig(replicas=1, host=host, ready_s=30)
    with running_replicas(cfg, tmp_path, ports=[port]) as urls:
        assert urls == [f"http://{URL_HOSTS[host]}:{port}"]
        with urllib.request.urlopen(urls[0] + "/health", timeout=5) as resp:
            assert resp.status == 200


def test_the_default_host_is_ipv4_loopback() -> None:
    assert ClusterConfig().host == "127.0.0.1"
    assert cluster._base_url("127.0.0.1", 8001) == "http://127.0.0.1:8001"
    assert cluster._base_url("localhost", 8001) == "http://localhost:8001"
    assert cluster._base_url("::", 8001) == "http://[::]:8001"
    assert cluster._base_url("fe80::1", 8001) == "http://[fe80::1]:8001"


class _Worker:
    """An OpenAI-shaped worker on ::1 for vllm-router."""

    def __init__(self) -> None:
        import http.server

        class Server(http.server.ThreadingHTTPServer):
            address_family = socket.AF_INET6

        self.server = Server(("::1", 0), OpenAIWorker)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://[::1]:{self.server.server_address[1]}"


@needs_ipv6
def test_the_router_runs_on_an_ipv6_host(tmp_path: Path) -> None:
    pytest.importorskip("vllm_router")
    worker = _Worker()
    try:
        port = _free_port("::1")
        with cluster.running_router([worker.url], tmp_path / "r.log", host="::1", port=port) as r:
            assert r == f"http://[::1]:{port}"
            with urllib.request.urlopen(r + "/health", timeout=5) as resp:
                assert resp.status == 200
    finally:
        worker.server.shutdown()
        worker.server.server_close()
