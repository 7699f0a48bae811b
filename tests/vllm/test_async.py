"""AsyncLLM (engine core in a child process) with concurrent tagged requests: lossless."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.vllm.conftest import ENGINE_KW, PROMPTS, greedy, wire

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def async_llm() -> Iterator[Any]:
    from agentspec_mw_vllm.engine import build_async_llm, shutdown
    from tests.vllm.test_engine import _agentspec_available

    spec = "agentspec" if _agentspec_available() else "agentspec_mw.peers.suffix.SuffixProposer"
    engine = build_async_llm(speculative=spec, **ENGINE_KW)
    try:
        yield engine
    finally:
        shutdown(engine)


async def _one(engine: Any, prompt: str, params: Any) -> list[int]:
    final = None
    async for out in engine.generate(prompt, params, request_id=f"t-{uuid.uuid4().hex}"):
        final = out
    assert final is not None and final.finished
    return list(final.outputs[0].token_ids)


def test_async_concurrent_requests_are_lossless(
    async_llm: Any, baseline_outputs: list[list[int]]
) -> None:
    async def run() -> list[list[int]]:
        jobs = [_one(async_llm, p, greedy(extra=wire(i))) for i, p in enumerate(PROMPTS)]
        jobs.append(_one(async_llm, PROMPTS[0], greedy(extra={"agentspec_v": 99})))
        return list(await asyncio.gather(*jobs))

    outs = asyncio.run(run())
    assert outs[: len(PROMPTS)] == baseline_outputs
    assert outs[-1] == baseline_outputs[0]  # malformed tags: served tag-free, same output
