"""``benchmarks/_oracle_proposer.py``: what ``oracle_ceiling.py`` drives inside the engine."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import Draft, ProposerEnv, StepContext
from agentspec_mw.replay.sim import replay_workload
from tests.helpers import react_calls, script

COST = get_cost_model("llama8b-h100")
STEP = StepContext(batch_size=1, num_kv_tokens=4)


def _env() -> ProposerEnv:
    return ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], cost_model=COST, max_k=8)


@pytest.fixture
def oracle(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The proposer's module, its class-wide memory empty for the test."""
    mod = script("_oracle_proposer")
    monkeypatch.setattr(mod.OracleProposer, "memory", {})
    return mod


def _at_token_7(mod: ModuleType) -> tuple[Any, list[int]]:
    """A proposer with request ``a`` one token (7) into its prompt's recorded output."""
    prop = mod.OracleProposer(_env())
    prompt = [1, 2, 3]
    mod.OracleProposer.memory[mod._digest(prompt)] = [7, 8, 9, 10]
    prop.start("a", prompt)
    prop.extend("a", [7])
    return prop, prompt


def test_modes_off_oracle_trim_agentspec(
    oracle: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = oracle.OracleProposer
    calls = react_calls(6, grow=3)
    prop = cls(_env())

    monkeypatch.setattr(cls, "mode", "off")
    off = replay_workload(calls, prop, batch=2, k=8, cost_model=COST)
    assert off.drafted == 0
    assert len(cls.memory) == len(calls)  # every prompt's output, all but the last token(s)
    assert prop.inner.stats["steps"] == 0  # AgentSpec sees only its own modes' requests

    monkeypatch.setattr(cls, "mode", "oracle")
    perfect = replay_workload(calls, prop, batch=2, k=8, cost_model=COST)
    assert perfect.drafted > 0 and perfect.accepted == perfect.drafted
    assert prop.inner.stats["steps"] == 0

    monkeypatch.setattr(cls, "mode", "trim")
    trim = replay_workload(calls, prop, batch=2, k=8, cost_model=COST)
    assert trim.drafted > 0 and trim.accepted == trim.drafted  # cut to the accepted prefix

    monkeypatch.setattr(cls, "memory", {})  # the drafts now can only be AgentSpec's own
    monkeypatch.setattr(cls, "mode", "agentspec")
    spec = replay_workload(calls, prop, batch=2, k=8, cost_model=COST)
    assert 0 < spec.accepted <= spec.drafted


def test_oracle_never_drafts_for_an_output_that_went_elsewhere(
    oracle: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = oracle.OracleProposer
    monkeypatch.setattr(cls, "mode", "oracle")
    prop, prompt = _at_token_7(oracle)
    assert prop.propose(["a"], 2, STEP)[0].token_ids == (8, 9)
    prop.start("b", prompt)
    prop.extend("b", [5])  # not the recorded output: no draft
    assert prop.propose(["b"], 2, STEP)[0].token_ids == ()
    prop.stop("a")
    prop.stop("b")
    assert cls.memory[oracle._digest(prompt)] == [7, 8, 9, 10]  # a shorter pass keeps the longer


def test_trim_cuts_agentspecs_draft_where_it_leaves_the_output(
    oracle: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = oracle.OracleProposer
    monkeypatch.setattr(cls, "mode", "trim")
    prop, _ = _at_token_7(oracle)
    drafts = [Draft((8, 9, 5, 6), (0.9, 0.8, 0.7, 0.6))]
    monkeypatch.setattr(prop.inner, "propose", lambda ids, k, step: list(drafts))
    assert prop.propose(["a"], 4, STEP) == [Draft((8, 9), (0.9, 0.8))]
    monkeypatch.setattr(cls, "mode", "agentspec")
    assert prop.propose(["a"], 4, STEP) == drafts  # as AgentSpec made it
