"""The metrics' per-step shortcuts (remembered labels, cached Prometheus children) count
exactly what the plain path counted."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from prometheus_client import REGISTRY

from agentspec_mw_vllm import metrics as metrics_mod
from agentspec_mw_vllm.metrics import DrafterMetrics


class _PlainCapped:
    """``_Capped`` without its memo (the reference)."""

    def __init__(self, cap: int, fixed: frozenset[str] = frozenset()) -> None:
        self.cap, self.fixed, self.seen = cap, fixed, set[str]()

    def __call__(self, value: str) -> str:
        label = metrics_mod._clean(value)
        if label in self.fixed or label in self.seen:
            return label
        if len(self.seen) < self.cap:
            self.seen.add(label)
            return label
        return "other"


def test_remembered_labels_are_the_labels_the_cap_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_mod, "_MEMO_VALUES", 7)  # past it, values are cleaned again
    fixed = frozenset({"code", "plan"})
    memo, plain = metrics_mod._Capped(5, fixed), _PlainCapped(5, fixed)
    # raw values that clean to one label, fixed names, more values than the cap, repeats
    values = ["a\nb", "a_b", "code", 'x"', "x_", "plan", "ü", "?", "c", "d", "e", "f", "g"]
    values = [v for _ in range(3) for v in values] + [f"v{i}" for i in range(20)] + values
    assert [memo(v) for v in values] == [plain(v) for v in values]
    assert len(memo._memo) == 7 and memo.seen == plain.seen


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_prometheus_mirror_counts_what_the_python_counters_count() -> None:
    m = DrafterMetrics(labels="agent,scope")
    assert m._prom is not None
    agent = m.agent_label(f"cache-{uuid.uuid4().hex[:8]}")
    scope = m.scope_label(f"tenant-{uuid.uuid4().hex[:8]}")
    steps0 = _sample("agentspec_draft_steps_total") or 0.0
    offered0 = _sample("agentspec_budget_offered_tokens_total") or 0.0
    used0 = _sample("agentspec_budget_used_tokens_total") or 0.0
    for drafted, accepted in ((4, 0), (3, 3), (5, 1)):
        m.record_verified(agent, "code", drafted, accepted, scope)
    m.record_verified(agent, "plan", 2, 0, scope)  # nothing accepted: no accepted series
    for offered, used in ((8, 5), (0, 0), (8, 0)):
        m.record_step(offered, used, 1e-4)
    m.record_step_model(0.05, 3e-4, 1e-8, 20)
    m.record_step_model(0.04, 2e-4, 2e-8, 21)
    assert _sample("agentspec_drafted_tokens_total", agent=agent, block="code") == 12
    assert _sample("agentspec_accepted_tokens_total", agent=agent, block="code") == 4
    assert _sample("agentspec_drafted_tokens_total", agent=agent, block="plan") == 2
    assert _sample("agentspec_accepted_tokens_total", agent=agent, block="plan") is None
    assert scope is not None
    assert _sample("agentspec_scope_drafted_tokens_total", scope=scope) == 14
    assert _sample("agentspec_scope_accepted_tokens_total", scope=scope) == 4
    assert _sample("agentspec_draft_steps_total") == steps0 + 3
    assert _sample("agentspec_budget_offered_tokens_total") == offered0 + 16
    assert _sample("agentspec_budget_used_tokens_total") == used0 + 5
    assert _sample("agentspec_step_model_seconds", term="fixed") == 0.04
    assert _sample("agentspec_step_model_seconds", term="kv_token") == 2e-8
    snap = m.snapshot()
    assert snap.drafted == {f"{agent}/code": 12, f"{agent}/plan": 2}
    assert snap.accepted == {f"{agent}/code": 4, f"{agent}/plan": 0}
    assert snap.step_model["steps"] == 21.0


@pytest.mark.parametrize("positions", ["few", "many"])  # under and over _SMALL_BIN
def test_a_steps_verified_rows_count_what_each_row_counts_alone(positions: str) -> None:
    """``record_verified_many`` (the adapter's per-step call) against a reference that
    counts every row on its own, as ``record_verified`` did before it was batched."""
    rng = np.random.default_rng(5)
    n_rows = 3 if positions == "few" else 60
    rows: list[metrics_mod.Verified] = []
    for i in range(n_rows):
        drafted = int(rng.integers(0, 6))
        accepted = int(rng.integers(0, drafted + 1))
        survival = None
        if i % 3:
            survival = list(np.cumprod(rng.uniform(0.2, 1.0, drafted)))
        rows.append(
            (f"a{i % 4}", ["code", "plan", "b:x"][i % 3], drafted, accepted, f"s{i % 2}", survival)
        )
    m = DrafterMetrics(prometheus=False, labels="agent,scope")
    m.record_verified_many(rows)
    snap = m.snapshot()
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    expected: dict[str, float] = {}
    scope_drafted: dict[str, int] = {}
    bins = [[0, 0.0, 0] for _ in range(metrics_mod.SURVIVAL_BINS)]
    for agent, block, d, a, scope, surv in rows:
        if d <= 0:
            continue
        key = f"{agent}/{metrics_mod._clean(block)}"
        drafted[key] = drafted.get(key, 0) + d
        accepted[key] = accepted.get(key, 0) + a
        assert scope is not None
        scope_drafted[scope] = scope_drafted.get(scope, 0) + d
        if surv is not None:
            expected[key] = expected.get(key, 0.0) + sum(surv)
            for j, s in enumerate(surv):
                row = bins[min(metrics_mod.SURVIVAL_BINS - 1, int(s * metrics_mod.SURVIVAL_BINS))]
                row[0] += 1
                row[1] += s
                row[2] += j < a
    assert snap.drafted == drafted and snap.accepted == accepted
    assert snap.scope_drafted == scope_drafted
    assert snap.expected.keys() == expected.keys()
    assert all(snap.expected[k] == pytest.approx(v) for k, v in expected.items())
    assert [(n, a) for n, _, a in snap.reliability] == [(n, a) for n, _, a in bins]
    assert [x for _, x, _ in snap.reliability] == pytest.approx([x for _, x, _ in bins])
    for bad in (
        [0.5],
        [0.5, float("nan"), 0.2],
        [0.9, 1.5, 0.1],
        [-0.1, 0.2, 0.1],
        [0.5, "x", 0.1],
    ):
        with pytest.raises(ValueError, match="survivals"):
            m.record_verified_many(
                [("b", "text", 2, 1, None, None), ("a", "code", 3, 1, None, bad)]
            )
    assert m.snapshot().drafted == drafted  # a bad row counts nothing of its call
