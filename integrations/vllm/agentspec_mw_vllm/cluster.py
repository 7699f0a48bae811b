"""``agentspec cluster``: several ``agentspec serve`` replicas behind ``vllm-router``.

AgentSpec's drafting history lives in each replica's proposer, so a router should keep a
query's requests on one replica. ``vllm-router --policy consistent_hash`` hashes the
``x-session-id`` header, which the LangGraph adapter sets on every tagged request
(:mod:`agentspec_mw_langgraph.routing`). This module only starts and stops processes; the
routing is vllm-router's::

    agentspec cluster --replicas 2 --port 8000 -- --max-model-len 1024 -- --enforce-eager

starts replicas on ports 8001 and 8002 (``agentspec serve --port P`` plus the arguments
after the first ``--``) and the router on 8000, all on 127.0.0.1 unless ``--host`` says
otherwise, and stops them all on Ctrl-C or SIGTERM. :func:`running_replicas` and
:func:`running_router` are the same as context managers (tests, benchmarks).

Each port must be free before its process starts (``ClusterError`` "port P ... is in
use" otherwise: a stale server answering ``/health`` there would pass for the replica). A
process is healthy only while it runs and its ``/health`` answers HTTP 200; the running
cluster stops, with the log tail of the process, as soon as any of its processes exits.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentspec_mw.errors import AgentSpecError, MissingDependencyError

__all__ = [
    "ClusterConfig",
    "ClusterError",
    "RouterPolicy",
    "router_command",
    "run_cluster",
    "running_replicas",
    "running_router",
]

RouterPolicy = Literal["consistent_hash", "round_robin", "random", "power_of_two", "cache_aware"]
ROUTER_VERSION = "0.1.17"
"""The vllm-router release this was written and run against (scripts/bootstrap.sh)."""


class ClusterError(AgentSpecError, RuntimeError):
    """A replica or the router exited or did not become healthy in time."""


class ClusterConfig(BaseModel):
    """What ``agentspec cluster`` starts."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    replicas: int = Field(default=2, ge=1, le=64)
    """How many ``agentspec serve`` replicas."""
    host: str = "127.0.0.1"
    """Bind address of the router and the replicas."""
    port: int = Field(default=8000, ge=1, le=65535)
    """The router's port; replica ``i`` listens on ``port + 1 + i`` (so ``port +
    replicas`` must be at most 65535)."""
    policy: RouterPolicy = "consistent_hash"
    """vllm-router's ``--policy``: ``consistent_hash`` keeps one ``x-session-id`` on one
    replica; ``round_robin`` is the comparison without affinity."""
    serve_args: tuple[str, ...] = ()
    """Arguments of every ``agentspec serve`` (after ``--port``)."""
    router_args: tuple[str, ...] = ()
    """More ``vllm-router`` arguments."""
    ready_s: float = Field(default=600, gt=0)
    """How long a replica (or the router) may take to become healthy."""

    @model_validator(mode="after")
    def _ports_in_range(self) -> ClusterConfig:
        last = self.port + self.replicas
        if last > 65535:
            raise ValueError(
                f"port={self.port} with replicas={self.replicas}: the replicas would listen "
                f"on ports {self.port + 1}..{last}, past 65535; choose a --port of at most "
                f"{65535 - self.replicas}"
            )
        return self

    def replica_ports(self) -> list[int]:
        """The replicas' ports."""
        return [self.port + 1 + i for i in range(self.replicas)]


def _router_binary() -> str:
    here = Path(sys.executable).with_name("vllm-router")
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if found is None:
        raise MissingDependencyError(
            "vllm-router", "agentspec cluster", f"pip install 'vllm-router=={ROUTER_VERSION}'"
        )
    return found


def router_command(
    worker_urls: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    policy: RouterPolicy = "consistent_hash",
    metrics_port: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of a ``vllm-router`` in front of ``worker_urls``; ``metrics_port`` is its
    Prometheus exporter's port (``None``: vllm-router's default, one per machine). Under
    ``consistent_hash`` the router's circuit breaker is off: after two errors from a key's
    replica it sent the key's later calls to another replica for good, splitting a query's
    history between two proposers while the cluster looked healthy (a replica that dies
    stops the cluster instead: :func:`run_cluster`).

    Raises:
        MissingDependencyError: ``vllm-router`` is not installed.
    """
    argv = [_router_binary(), "--host", host, "--port", str(port), "--policy", policy]
    if policy == "consistent_hash":
        argv.append("--disable-circuit-breaker")
    if metrics_port is not None:
        argv += ["--prometheus-host", host, "--prometheus-port", str(metrics_port)]
    return [*argv, "--worker-urls", *worker_urls, *extra]


def _free_port(host: str) -> int:
    from agentspec_mw_vllm.serve import bind_family

    with socket.socket(bind_family(host)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _base_url(host: str, port: int) -> str:
    """``http://host:port``, an IPv6 literal in brackets (``http://[::1]:8001``; RFC 3986),
    as urllib and vllm-router parse it."""
    from agentspec_mw_vllm.serve import bind_family

    where = f"[{host}]" if bind_family(host) == socket.AF_INET6 else host
    return f"http://{where}:{port}"


def _healthy(url: str) -> bool:
    """Whether ``url`` answers HTTP 200 (no answer, an error status or a reply that is not
    HTTP -- another service on the port -- all read as not healthy)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return False


def _check_ports_free(host: str, ports: Sequence[tuple[int, str]]) -> None:
    """Raise :class:`ClusterError` if one of ``ports`` (port, what) is taken on ``host``.

    Binds each (with ``SO_REUSEADDR``, as the servers do, so a port in ``TIME_WAIT``
    passes): a server already listening there would answer the health checks in place of
    the process about to start.
    """
    from agentspec_mw_vllm.serve import port_taken

    for port, what in ports:
        reason = port_taken(host, port)
        if reason is not None:
            raise ClusterError(
                f"port {port} on {host} {reason}, needed by {what}; stop what listens "
                "there, or choose another --port (the router takes PORT, replica i "
                "PORT+1+i)"
            )


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 60) -> None:
    """SIGTERM (``agentspec serve`` forwards it to vLLM), SIGKILL after ``grace_s``, then
    SIGKILL to anything left in the process's session."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


#: A started process: the process, its health URL, its log file, what it is.
_Proc = tuple[subprocess.Popen[bytes], str, Path, str]


@contextmanager
def _process(
    argv: Sequence[str], log: Path, health: str, ready_s: float, what: str
) -> Iterator[_Proc]:
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        item = (proc, health, log, what)
        _wait_healthy([item], ready_s)
        yield item
    finally:
        _stop(proc)


def _exited(procs: Sequence[_Proc]) -> str | None:
    """A report on the first of ``procs`` that has exited (its log's tail), or ``None``."""
    for proc, _, log, what in procs:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            return f"{what} exited with {proc.returncode}; log {log}:\n{tail}"
    return None


def _wait_healthy(procs: Sequence[_Proc], ready_s: float) -> None:
    """Wait until every process answers its health check, each while still running.

    Raises:
        ClusterError: a process exited, or was not healthy within ``ready_s``.
    """
    deadline = time.monotonic() + ready_s
    pending = list(procs)
    while pending:
        for item in list(pending):
            if _healthy(item[1]):
                pending.remove(item)
        exited = _exited(procs)  # all of them: a healthy one may have died since
        if exited is not None:
            raise ClusterError(exited)
        if pending and time.monotonic() > deadline:
            names = ", ".join(what for _, _, _, what in pending)
            log_dir = pending[0][2].parent
            raise ClusterError(f"{names} not healthy in {ready_s:.0f} s (logs in {log_dir})")
        if pending:
            time.sleep(1)


def _serve_argv(cfg: ClusterConfig, port: int) -> list[str]:
    """The argv of the ``agentspec serve`` replica on ``port``."""
    argv = [sys.executable, "-m", "agentspec_mw.cli", "serve", "--host", cfg.host]
    return [*argv, "--port", str(port), *cfg.serve_args]


@contextmanager
def running_replicas(
    cfg: ClusterConfig, log_dir: Path, ports: Sequence[int] | None = None
) -> Iterator[list[str]]:
    """Start ``cfg.replicas`` ``agentspec serve`` processes at once; yield their base URLs
    (``http://host:port``, ``http://[host]:port`` for IPv6) once all are healthy; stop
    them all when the block ends.
    ``ports`` overrides :meth:`ClusterConfig.replica_ports` (one per replica).

    Raises:
        ClusterError: a replica's port is in use, or a replica exited or was not healthy
            within ``cfg.ready_s``.
    """
    with _replicas(cfg, log_dir, ports) as procs:
        yield [health.removesuffix("/health") for _, health, _, _ in procs]


@contextmanager
def _replicas(
    cfg: ClusterConfig, log_dir: Path, ports: Sequence[int] | None
) -> Iterator[list[_Proc]]:
    """:func:`running_replicas`, yielding the processes."""
    log_dir.mkdir(parents=True, exist_ok=True)
    ports = list(ports) if ports is not None else cfg.replica_ports()
    if len(ports) != cfg.replicas:
        raise ValueError(f"{len(ports)} ports given for {cfg.replicas} replicas")
    names = [f"replica {i} (port {port})" for i, port in enumerate(ports)]
    _check_ports_free(cfg.host, list(zip(ports, names, strict=True)))
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    procs: list[_Proc] = []
    try:
        for i, port in enumerate(ports):
            log = log_dir / f"replica{i}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    _serve_argv(cfg, port),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((proc, f"{_base_url(cfg.host, port)}/health", log, names[i]))
        _wait_healthy(procs, cfg.ready_s)
        yield procs
    finally:
        for proc, *_ in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, *_ in procs:
            _stop(proc)


@contextmanager
def running_router(
    worker_urls: Sequence[str],
    log: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    policy: RouterPolicy = "consistent_hash",
    extra: Sequence[str] = (),
    ready_s: float = 120,
) -> Iterator[str]:
    """Run ``vllm-router`` in front of ``worker_urls`` until the block ends; yield its URL.
    Its Prometheus exporter gets a free port, so several routers can run side by side.

    Raises:
        MissingDependencyError: ``vllm-router`` is not installed.
        ClusterError: ``port`` is in use, or the router exited or was not healthy within
            ``ready_s``.
    """
    with _router(worker_urls, log, host, port, policy, extra, ready_s) as item:
        yield item[1].removesuffix("/health")


@contextmanager
def _router(
    worker_urls: Sequence[str],
    log: Path,
    host: str,
    port: int,
    policy: RouterPolicy,
    extra: Sequence[str],
    ready_s: float,
) -> Iterator[_Proc]:
    """:func:`running_router`, yielding the process."""
    what = f"vllm-router ({policy}, port {port})"
    _check_ports_free(host, [(port, what)])
    metrics = _free_port(host)
    argv = router_command(
        worker_urls, host=host, port=port, policy=policy, metrics_port=metrics, extra=extra
    )
    with _process(argv, log, f"{_base_url(host, port)}/health", ready_s, what) as item:
        yield item


def run_cluster(cfg: ClusterConfig, log_dir: Path, *, check_s: float = 5.0) -> int:
    """Start the replicas and the router, print where they are, and wait for Ctrl-C or
    SIGTERM; then stop everything. Every ``check_s`` seconds each process must still run
    (else the cluster stops at once, printing the log tail of the one that exited) and
    answer its health check (three misses in a row stop it: a busy replica may miss one).
    Returns 0, or 1 when a process died or stayed unhealthy."""

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with ExitStack() as stack:
            print(f"agentspec cluster: starting {cfg.replicas} replicas, logs in {log_dir}")
            # the router's port first: a taken one fails before the replicas load
            what = f"vllm-router ({cfg.policy}, port {cfg.port})"
            _check_ports_free(cfg.host, [(cfg.port, what)])
            replicas = stack.enter_context(_replicas(cfg, log_dir, None))
            urls = [health.removesuffix("/health") for _, health, _, _ in replicas]
            router = stack.enter_context(
                _router(
                    urls,
                    log_dir / "router.log",
                    cfg.host,
                    cfg.port,
                    cfg.policy,
                    cfg.router_args,
                    120,
                )
            )
            base = router[1].removesuffix("/health")
            print(f"agentspec cluster: router ({cfg.policy}) at {base}/v1 -> {' '.join(urls)}")
            print("agentspec cluster: Ctrl-C stops it", flush=True)
            procs = [*replicas, router]
            failures = 0
            while failures < 3:  # a busy replica may miss one health check
                time.sleep(check_s)
                exited = _exited(procs)
                if exited is not None:
                    print(f"agentspec cluster: {exited}\nstopping", file=sys.stderr, flush=True)
                    return 1
                healthy = all(_healthy(health) for _, health, _, _ in procs)
                failures = 0 if healthy else failures + 1
            print("agentspec cluster: a process is not healthy; stopping", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print("agentspec cluster: stopped", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
