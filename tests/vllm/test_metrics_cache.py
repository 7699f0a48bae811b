"""The metrics' per-step shortcuts (remembered labels, cached Prometheus children) count
exactly what the plain path counted."""

from __future__ import annotations

import uuid

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
