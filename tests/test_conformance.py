"""A conformance suite every proposer passes: the builtins here, any new one by name."""

from __future__ import annotations

import pytest

from agentspec_mw.costmodel import PRESETS
from agentspec_mw.proposer import Proposer, ProposerEnv, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.run import build_calls
from agentspec_mw.replay.sim import replay_workload
from agentspec_mw.tags import StructureTags
from agentspec_mw.tokens import token_bytes_table
from agentspec_mw.traces.tokenized import tokenize_trace

COST = PRESETS["llama8b-h100"]
PROPOSERS = ["none", "ngram", "suffix", "agentspec"]


@pytest.fixture(scope="module")
def env(tiny_tokenizer) -> ProposerEnv:  # type: ignore[no-untyped-def]
    return ProposerEnv(token_bytes=token_bytes_table(tiny_tokenizer), cost_model=COST, max_k=8)


@pytest.fixture(scope="module")
def calls(tiny_tokenizer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.conftest import SAMPLE

    tr = tokenize_trace(
        SAMPLE, tiny_tokenizer, cache_dir=tmp_path_factory.mktemp("c"), progress=False
    )
    by_wl = build_calls([tr])
    return by_wl["sample_tool_agent"] + by_wl["sample_react"]


def _counts(name: str, env: ProposerEnv, calls, batch: int, k: int) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    r = replay_workload(calls, make_proposer(name, env), batch=batch, k=k, cost_model=COST)
    assert r.drafted <= k * r.steps
    return r.steps, r.drafted, r.accepted


@pytest.mark.peers
@pytest.mark.parametrize("name", PROPOSERS)
def test_implements_protocol_and_is_deterministic(name: str, env: ProposerEnv, calls) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(make_proposer(name, env), Proposer)
    for batch, k in ((1, 4), (4, 8)):
        # replay_workload raises if a draft is longer than k
        assert _counts(name, env, calls, batch, k) == _counts(name, env, calls, batch, k)


@pytest.mark.peers
@pytest.mark.parametrize("name", PROPOSERS)
def test_stop_restart_and_no_leak(name: str, env: ProposerEnv) -> None:
    p = make_proposer(name, env)
    tags = StructureTags(agent_id="a", query_id="q")
    step = StepContext(batch_size=2, num_kv_tokens=20)
    p.start("r1", [1, 2, 3, 4, 5, 6, 7, 8], tags)
    p.extend("r1", [1])
    p.start("r1", [9, 9, 9], tags)  # restart of a live id replaces its state
    p.extend("r1", [9])
    p.start(
        "r2", [1, 2, 3, 4, 5, 1, 2, 3, 4], StructureTags(scope="other", agent_id="a", query_id="q")
    )
    p.extend("r2", [5])
    d1, d2 = p.propose(["r1", "r2"], 4, step)
    assert len(d1) <= 4 and len(d2) <= 4
    assert not set(d1.token_ids) - {9}  # r1 drafts only from its own (new) context
    p.stop("r1")
    p.stop("r1")  # idempotent
    p.stop("r2")
