"""Server-side faults caught before or while anything runs (no vLLM engine started):
``agentspec cluster`` with a taken port, a health reply that is not HTTP, a process that
exits while the cluster runs; ``agentspec serve`` flags and environment that would fail
only in the server (``--max-body-bytes 0``, an option the proposer does not take, a
malformed ``AGENTSPEC_METRICS_LABELS``)."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import agentspec_mw_vllm.cluster as cluster
from agentspec_mw.cli import build_parser
from agentspec_mw.errors import ProposerLoadError
from agentspec_mw_vllm.cli import serve_config_from_args
from agentspec_mw_vllm.cluster import ClusterConfig, ClusterError, run_cluster, running_replicas
from agentspec_mw_vllm.config import drafter_section
from agentspec_mw_vllm.metrics import LABELS_ENV, DrafterMetrics
from agentspec_mw_vllm.serve import ServeConfig, server_command, server_env
from tests.serving import free_port

# --- agentspec cluster --------------------------------------------------------------


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def squatter() -> Iterator[int]:
    """A port where another HTTP server (e.g. a stale one) answers every health check."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_a_taken_replica_port_fails_before_anything_starts(
    squatter: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []

    def argv(cfg: ClusterConfig, port: int) -> list[str]:
        started.append([str(port)])
        return [sys.executable, "-c", "import time; time.sleep(30)"]

    monkeypatch.setattr(cluster, "_serve_argv", argv)
    cfg = ClusterConfig(replicas=1, ready_s=5)
    with pytest.raises(ClusterError, match=rf"port {squatter} on 127.0.0.1 is in use") as info:
        with running_replicas(cfg, tmp_path, ports=[squatter]):
            pass
    assert "replica 0" in str(info.value) and "--port" in str(info.value)
    assert started == []


def test_a_health_reply_that_is_not_http_is_unhealthy() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")  # another service on the port

        threading.Thread(target=serve, daemon=True).start()
        assert cluster._healthy(f"http://127.0.0.1:{srv.getsockname()[1]}/health") is False


_FAKE_SERVER = """
import http.server, sys, threading, time
port, lifetime = int(sys.argv[1]), float(sys.argv[2])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("fake server up", flush=True)
time.sleep(lifetime)
print("fake replica: out of memory", flush=True)
sys.exit(3)
"""


def _two_free_ports() -> int:
    """A port P with P and P + 1 free on 127.0.0.1."""
    for _ in range(50):
        port = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise AssertionError("no two adjacent free ports")


def test_the_running_cluster_stops_when_a_process_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "fake_server.py"
    script.write_text(_FAKE_SERVER)

    def serve_argv(cfg: ClusterConfig, port: int) -> list[str]:
        return [sys.executable, str(script), str(port), "2"]  # healthy, then exits

    def router(urls: Sequence[str], *, port: int, **kwargs: Any) -> list[str]:
        return [sys.executable, str(script), str(port), "60"]

    monkeypatch.setattr(cluster, "_serve_argv", serve_argv)
    monkeypatch.setattr(cluster, "router_command", router)
    cfg = ClusterConfig(replicas=1, port=_two_free_ports(), ready_s=20)
    assert run_cluster(cfg, tmp_path / "logs", check_s=0.2) == 1
    err = capsys.readouterr().err
    assert f"replica 0 (port {cfg.port + 1}) exited with 3" in err
    assert "fake replica: out of memory" in err  # the log's tail


def test_a_taken_router_port_fails_before_the_replicas_start(
    squatter: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "_serve_argv", lambda cfg, port: pytest.fail("started"))
    with pytest.raises(ClusterError, match=rf"port {squatter} .* in use, needed by vllm-router"):
        run_cluster(ClusterConfig(replicas=1, port=squatter), tmp_path)


# --- agentspec serve ----------------------------------------------------------------


def _cfg(*argv: str) -> ServeConfig:
    cfg = serve_config_from_args(build_parser().parse_args(["serve", *argv]))
    assert isinstance(cfg, ServeConfig)
    return cfg


def test_max_body_bytes_zero_is_rejected_not_defaulted() -> None:
    with pytest.raises(ValueError, match="max_body_bytes"):
        _cfg("--max-body-bytes", "0")
    assert _cfg("--max-body-bytes", "2048").max_body_bytes == 2048


def test_a_proposer_option_it_does_not_take_fails_before_the_server_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTSPEC_PROPOSER_OPTIONS", raising=False)
    cfg = _cfg("--model", "m", "--proposer-options", '{"no_such_option": 1}')
    with pytest.raises(ProposerLoadError, match="no_such_option"):
        server_command(cfg)  # also what --dry-run prints: nothing starts
    with pytest.raises(ProposerLoadError, match="no_such_option"):
        drafter_section("agentspec", {"no_such_option": 1})
    # the environment's options apply where the caller chose none: they are checked too
    monkeypatch.setenv("AGENTSPEC_PROPOSER_OPTIONS", '{"bogus": 2}')
    with pytest.raises(ProposerLoadError, match="bogus"):
        server_command(_cfg("--model", "m"))
    good = {"index_max_tokens": 1024}
    argv = server_command(_cfg("--model", "m", "--proposer-options", json.dumps(good)))
    section = json.loads(argv[argv.index("--additional-config") + 1])["agentspec"]
    assert section == {"proposer": "agentspec", "options": good}


def test_a_malformed_metrics_labels_environment_fails_in_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LABELS_ENV, "agents")  # a typo of "agent"
    with pytest.raises(ValueError, match=rf"{LABELS_ENV}='agents'.*--metrics-labels"):
        ServeConfig(model="m")
    cfg = ServeConfig(model="m", metrics_labels="agent")  # the flag replaces the variable
    assert server_env(cfg=cfg)[LABELS_ENV] == "agent"
    bound = ServeConfig(model="m", scope_header="X-Tenant-Id")  # the server gets "none"
    assert server_env(cfg=bound)[LABELS_ENV] == "none"


def test_a_malformed_metrics_labels_environment_falls_back_in_the_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(LABELS_ENV, "agents")
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.metrics"):
        metrics = DrafterMetrics(prometheus=False)  # what the engine core makes
    assert metrics.labels == frozenset({"agent"})
    assert any(LABELS_ENV in r.getMessage() for r in caplog.records)
    monkeypatch.setenv(LABELS_ENV, "agent,scope")
    assert DrafterMetrics(prometheus=False).labels == frozenset({"agent", "scope"})
    with pytest.raises(ValueError, match="unknown"):
        DrafterMetrics(prometheus=False, labels="agents")  # a caller's own choice still raises


def test_serve_on_a_taken_port_fails_at_once_in_one_line(
    squatter: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentspec serve`` on a port in use: exit 2 with one line, no server started (vLLM
    loaded the model first and died ~15 s later with a 42-line traceback)."""
    from agentspec_mw_vllm import serve as serve_mod

    def popen(*a: object, **k: object) -> None:
        raise AssertionError("a server was started")

    monkeypatch.setattr(serve_mod.subprocess, "Popen", popen)
    cfg = serve_mod.ServeConfig(port=squatter)
    assert serve_mod.serve(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"agentspec serve: error: port {squatter} on 127.0.0.1 is in use; stop what listens "
        "there or choose another --port"
    ]
    # a --port after `--` goes to vLLM (the later one wins): not checked here, it starts
    moved = serve_mod.ServeConfig(port=squatter, extra_args=["--port", str(free_port())])
    with pytest.raises(AssertionError, match="a server was started"):
        serve_mod.serve(moved)
