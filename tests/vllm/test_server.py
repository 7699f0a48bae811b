"""``agentspec serve``: the real OpenAI server, tags in vllm_xargs, lossless, /metrics.

One server for the module (startup is most of the cost); every assertion shares it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.conftest import ENGINE_KW, MAX_TOKENS, PROMPTS, wire

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.vllm.test_engine import _agentspec_available

    port = _free_port()
    spec = "agentspec" if _agentspec_available() else "agentspec_mw.peers.suffix.SuffixProposer"
    log = tmp_path_factory.mktemp("server") / "server.log"
    argv = [sys.executable, "-m", "agentspec_mw.cli", "serve", "--port", str(port)]
    argv += ["--speculative", spec, "--k", str(ENGINE_KW["k"])]
    argv += ["--max-model-len", str(ENGINE_KW["max_model_len"]), "--"]
    argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(ENGINE_KW["kv_cache_memory_bytes"])]
    argv += ["--max-num-seqs", str(ENGINE_KW["max_num_seqs"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                _get(base + "/health")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"server not ready in 300 s:\n{log.read_text()[-4000:]}")
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


def _complete(base: str, prompt: str, xargs: dict[str, Any] | None) -> str:
    body: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
    }
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return str(_post(base + "/v1/completions", body)["choices"][0]["text"])


def test_server_is_lossless_with_tags_and_exports_metrics(
    server: str, baseline_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    tok = baseline_llm.get_tokenizer()
    expected = [tok.decode(ids, skip_special_tokens=True) for ids in baseline_outputs]
    jobs: list[tuple[str, dict[str, Any] | None]] = [(p, wire(i)) for i, p in enumerate(PROMPTS)]
    jobs += [(PROMPTS[1], {**wire(1), "agentspec_v": 42}), (PROMPTS[2], None)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(lambda j: _complete(server, *j), jobs))
    assert texts[: len(PROMPTS)] == expected
    assert texts[len(PROMPTS)] == expected[1]  # malformed tags: tag-free, same output
    assert texts[-1] == expected[2]  # no tags at all
    metrics = _get(server + "/metrics")
    assert "vllm:spec_decode_num_draft_tokens" in metrics
    assert 'agentspec_tag_rejections_total{reason="version"}' in metrics
    for name in ("agentspec_draft_steps_total", "agentspec_budget_offered_tokens_total"):
        assert name in metrics
    assert "agentspec_drafted_tokens_total{" in metrics
