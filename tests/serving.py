"""Start a real ``agentspec serve`` on 127.0.0.1 for a test module, and stop it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5) -> str:
    """GET ``url`` and return the body as text."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


@contextmanager
def running_server(serve_args: Sequence[str], log: Path, ready_s: float = 300) -> Iterator[str]:
    """Run ``agentspec serve --port P *serve_args`` until the block ends; yield its base URL.

    Fails the test with the server log's tail if it exits or is not healthy in time.
    """
    port = free_port()
    argv = [sys.executable, "-m", "agentspec_mw.cli", "serve", "--port", str(port), *serve_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                http_get(base + "/health")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"server not ready in {ready_s:.0f} s:\n{log.read_text()[-4000:]}")
                time.sleep(1)
        yield base
    finally:
        proc.terminate()  # agentspec serve forwards SIGTERM to the vLLM server
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:  # anything of this session still alive (the server's own children)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
