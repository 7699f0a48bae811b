"""A proposer whose drafts hold an out-of-vocabulary id cannot kill the real engine.

vLLM indexes its embedding with draft ids: an id past the vocabulary raises inside the
step and the engine dies (``EngineDeadError``). The adapter drops such rows before vLLM
sees them (:class:`~agentspec_mw_vllm.session.DraftSession`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentspec_mw_vllm.metrics import get_metrics
from agentspec_mw_vllm.session import BAD_DRAFT
from tests.vllm.conftest import PROMPTS, _build, generate_ids, greedy, wire

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MAX_TOKENS = 12
F32: dict[str, Any] = {"dtype": "float32"}


@pytest.fixture(scope="module")
def f32_baseline() -> list[list[int]]:
    """Greedy ids without speculation, float32 (greedy is batch-invariant there)."""
    for llm in _build(None, **F32):
        return generate_ids(llm, PROMPTS, greedy(MAX_TOKENS))
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def bad_llm(f32_baseline: list[list[int]]) -> Iterator[Any]:
    """The adapter driving a proposer that drafts id 10**6 for requests of agent ``bad``
    (its other rows are real SuffixDecoding drafts, so the engine verifies drafts)."""
    yield from _build(
        "tests.vllm.fakes.BadDraftProposer", proposer_options={"inner": "suffix"}, **F32
    )


def test_out_of_vocab_drafts_are_dropped_and_the_engine_lives(
    bad_llm: Any, f32_baseline: list[list[int]]
) -> None:
    before = get_metrics().snapshot()
    params = [
        greedy(MAX_TOKENS, extra=wire(i, agent="bad" if i % 2 else None))
        for i in range(len(PROMPTS))
    ]
    assert generate_ids(bad_llm, PROMPTS, params) == f32_baseline
    mid = get_metrics().snapshot()
    assert mid.faults.get(BAD_DRAFT, 0) > before.faults.get(BAD_DRAFT, 0)
    assert mid.total_drafted > before.total_drafted  # the good rows still drafted
    # the engine is alive and serves a second round, bad rows included
    assert generate_ids(bad_llm, PROMPTS, params) == f32_baseline
    after = get_metrics().snapshot()
    assert after.faults.get(BAD_DRAFT, 0) > mid.faults.get(BAD_DRAFT, 0)
    assert {k for k in after.faults if after.faults[k] != before.faults.get(k, 0)} == {BAD_DRAFT}
