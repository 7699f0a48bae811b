"""AgentSpec calibrates each decoding regime of a scope apart (``start(decoding=…)``): a
sampled request's draft token is accepted with the model's probability of it, a greedy
one's when it is the argmax, so their acceptance is learned in separate rows, while the
history drafts come from stays the scope's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agentspec_mw.agentspec import AgentSpecProposer
from agentspec_mw.agentspec.kernels import C_CAL
from agentspec_mw.costmodel import PRESETS
from agentspec_mw.proposer import Decoding, ProposerEnv, StepContext
from agentspec_mw.tags import StructureTags
from agentspec_mw.tokens import token_bytes_table

TEXT = "The plan: 1. read the file 2. fix the bug 3. run the tests 4. report back to the user."


def _prop(tokenizer: Any) -> AgentSpecProposer:
    env = ProposerEnv(
        token_bytes=token_bytes_table(tokenizer), cost_model=PRESETS["llama8b-h100"], max_k=8
    )
    return AgentSpecProposer(env, index_max_tokens=1 << 14)


def _run(
    p: AgentSpecProposer,
    rid: str,
    prompt: list[int],
    out: list[int],
    tags: StructureTags,
    decoding: Decoding,
) -> tuple[int, int]:
    """Verify one request's drafts against ``out`` (a greedy oracle); returns its scope
    row and the accepted draft tokens."""
    p.start(rid, prompt, tags, decoding=decoding)
    row = int(p._slots.si[p._reqs[rid], C_CAL])
    p.extend(rid, out[:1])
    pos, acc = 1, 0
    while pos < len(out):
        step = StepContext(batch_size=1, num_kv_tokens=len(prompt) + pos)
        d = p.propose([rid], 8, step)[0]
        a = 0
        while a < len(d) and pos + a < len(out) and d.token_ids[a] == out[pos + a]:
            a += 1
        adv = min(a + 1, len(out) - pos)
        p.extend(rid, out[pos : pos + adv])
        pos, acc = pos + adv, acc + a
    p.stop(rid)
    return row, acc


def test_each_regime_learns_in_its_own_row_from_the_same_history(tiny_tokenizer: Any) -> None:
    p = _prop(tiny_tokenizer)
    ids = list(tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"])
    prompt = ids[:3]
    tags = [StructureTags(agent_id="planner", query_id=f"q{i}") for i in range(6)]
    greedy_row, _ = _run(p, "g0", prompt, ids, tags[0], "greedy")
    flush = StepContext(batch_size=1, num_kv_tokens=1)
    p.propose([], 8, flush)  # apply the queued stop (its last counts)
    table = p._scopes.table[greedy_row].copy()
    rng = np.random.default_rng(0)
    rows = set()
    for i in range(1, 4):  # sampled requests whose text wanders off the history's
        noisy = [int(t) for t in rng.permutation(ids)]
        row, _ = _run(p, f"s{i}", prompt, noisy, tags[i], "sampled")
        rows.add(row)
    (sampled_row,) = rows
    assert sampled_row != greedy_row
    p.propose([], 8, flush)
    np.testing.assert_array_equal(p._scopes.table[greedy_row], table)  # greedy row untouched
    assert not np.array_equal(p._scopes.table[sampled_row], table)  # the sampled one learned
    # the history is the scope's: a sampled request drafts the greedy one's text
    row, acc = _run(p, "s9", prompt, ids, tags[4], "sampled")
    assert row == sampled_row and acc > len(ids) // 2
    constrained_row, _ = _run(p, "c0", prompt, ids, tags[5], "constrained")
    assert constrained_row not in (greedy_row, sampled_row)
    again, _ = _run(p, "g1", prompt, ids, tags[5], "greedy")
    assert again == greedy_row


def test_an_unknown_regime_is_refused_before_anything_changes(tiny_tokenizer: Any) -> None:
    p = _prop(tiny_tokenizer)
    p.start("a", [1, 2, 3])
    with pytest.raises(ValueError, match="decoding='beam'"):
        p.start("a", [4, 5], decoding="beam")  # type: ignore[arg-type]
    assert "a" in p._reqs and len(p._reqs) == 1


@pytest.mark.parametrize("decoding", ["sampled", "constrained"])
def test_tag_free_traffic_keeps_a_row_of_each_regime_for_good(
    tiny_tokenizer: Any, decoding: Decoding
) -> None:
    """The ``default`` scope's row of a regime other than greedy is held for good from its
    first request, as its greedy row is: tenants that come and go while that regime is
    idle take other rows, never its (one of them took it before and reset what it had
    learned). With every row held by live tenants, a regime without a row learns in its
    scope's greedy row (it got the frozen prior, which learns nothing, before)."""
    from agentspec_mw.agentspec.scopes import FROZEN

    env = ProposerEnv(
        token_bytes=token_bytes_table(tiny_tokenizer), cost_model=PRESETS["llama8b-h100"], max_k=8
    )
    p = AgentSpecProposer(env, index_max_tokens=1 << 12, calib_max_scopes=4)

    def row(rid: str) -> int:
        return int(p._slots.si[p._reqs[rid], C_CAL])

    p.start("s", [5, 6, 7], decoding=decoding)  # tag-free: the default scope
    kept = row("s")
    assert kept not in (FROZEN, p._calib.default_row)
    p.stop("s")
    for i in range(6):  # tenants come and go while the tag-free regime is idle
        p.start(f"t{i}", [1, 2, 3], StructureTags(scope=f"tenant{i}"))
        p.propose([f"t{i}"], 8, StepContext(batch_size=1, num_kv_tokens=3))
        p.stop(f"t{i}")
    p.start("s2", [5, 6, 7], decoding=decoding)
    assert row("s2") == kept and (("default", decoding) in p._scopes)
    assert p._scopes.overflows == 0

    # every row held: the default greedy row and the kept one, two live tenants
    q = AgentSpecProposer(env, index_max_tokens=1 << 12, calib_max_scopes=3)
    q.start("a", [1, 2, 3], StructureTags(scope="tenantA"))
    q.start("b", [1, 2, 3], StructureTags(scope="tenantB"))
    q.start("c", [1, 2, 3], StructureTags(scope="tenantA"), decoding=decoding)
    q.start("s", [5, 6, 7], decoding=decoding)
    rows = {r: int(q._slots.si[q._reqs[r], C_CAL]) for r in "abcs"}
    assert rows["c"] == rows["a"] and rows["s"] == q._calib.default_row
    assert q._scopes.overflows == 0
    q.start("d", [1, 2, 3], StructureTags(scope="tenantD"))  # no row, no greedy row: frozen
    assert int(q._slots.si[q._reqs["d"], C_CAL]) == FROZEN and q._scopes.overflows == 1
