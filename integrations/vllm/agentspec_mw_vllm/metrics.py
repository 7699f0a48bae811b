"""The adapter's counters: readable from Python and exported to Prometheus (``agentspec_``).

One :class:`DrafterMetrics` per process (:func:`get_metrics`), shared by the adapters in
it. :meth:`DrafterMetrics.snapshot` is the Python view (the embedded ``LLM`` runs the
adapter in the caller's process). Every update is mirrored into ``prometheus_client``
counters in the default registry; the OpenAI server (whose engine runs in a child
process) shows them on ``/metrics`` when ``PROMETHEUS_MULTIPROC_DIR`` is set, which
``agentspec serve`` does.

Prometheus names (labels in braces):

* ``agentspec_drafted_tokens_total{agent,block}`` — draft tokens the engine verified
  (after the scheduler trimmed drafts to its token budget);
* ``agentspec_accepted_tokens_total{agent,block}`` — of those, tokens accepted;
* ``agentspec_budget_offered_tokens_total`` — the per-row caps offered to the proposer
  (``k``, less near ``max_model_len``), summed over rows and steps;
* ``agentspec_budget_used_tokens_total`` — draft tokens the proposer returned;
* ``agentspec_tag_rejections_total{reason}`` — requests whose wire tags were rejected
  (they ran tag-free);
* ``agentspec_proposer_faults_total{kind}`` — proposer exceptions (``kind`` = verb and
  exception type); that step got no drafts;
* ``agentspec_proposer_seconds`` — a histogram of the adapter's time per draft call;
* ``agentspec_draft_steps_total`` — draft calls;
* ``agentspec_step_model_seconds{term}`` — with ``cost_model="measured"``, the engine's
  fitted step time: ``term="fixed"`` (seconds per step), ``"token"`` (per batched token),
  ``"kv_token"`` (per resident KV-cache token).

``agent`` is the tag's ``agent_id`` (``untagged`` without tags); at most
:data:`MAX_AGENT_LABELS` distinct agents get their own label, later ones count as
``other``. ``block`` is the block type the proposer reports for the request
(``block_of(req_id)``, when it has one), else the tag's ``segment``, else ``none``.
"""

from __future__ import annotations

import threading
from collections import Counter

from pydantic import BaseModel, ConfigDict

__all__ = ["MAX_AGENT_LABELS", "DrafterMetrics", "MetricsSnapshot", "get_metrics"]

MAX_AGENT_LABELS = 64
_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


class MetricsSnapshot(BaseModel):
    """A copy of the counters at one moment (keys of the dicts: ``"agent/block"``)."""

    model_config = ConfigDict(frozen=True)

    drafted: dict[str, int]
    accepted: dict[str, int]
    budget_offered: int
    budget_used: int
    tag_rejections: dict[str, int]
    faults: dict[str, int]
    draft_steps: int
    proposer_seconds: float
    step_model: dict[str, float] = {}
    """The fitted step time (``fixed``, ``token``, ``kv_token`` in seconds; ``steps``
    timed) when the adapter measures it, else empty."""

    @property
    def total_drafted(self) -> int:
        """Draft tokens verified, all agents."""
        return sum(self.drafted.values())

    @property
    def total_accepted(self) -> int:
        """Draft tokens accepted, all agents."""
        return sum(self.accepted.values())


class _Prom:
    """The prometheus_client mirror (created once per process, lazily)."""

    def __init__(self) -> None:
        from prometheus_client import Counter as PCounter
        from prometheus_client import Gauge, Histogram

        self.drafted = PCounter(
            "agentspec_drafted_tokens", "Draft tokens verified", ["agent", "block"]
        )
        self.accepted = PCounter(
            "agentspec_accepted_tokens", "Draft tokens accepted", ["agent", "block"]
        )
        self.offered = PCounter("agentspec_budget_offered_tokens", "Draft slots offered")
        self.used = PCounter("agentspec_budget_used_tokens", "Draft tokens proposed")
        self.rejections = PCounter(
            "agentspec_tag_rejections", "Requests whose tags were rejected", ["reason"]
        )
        self.faults = PCounter("agentspec_proposer_faults", "Proposer exceptions", ["kind"])
        self.seconds = Histogram(
            "agentspec_proposer_seconds", "Adapter time per draft call", buckets=_BUCKETS
        )
        self.steps = PCounter("agentspec_draft_steps", "Draft calls")
        self.step_model = Gauge(
            "agentspec_step_model_seconds",
            "Fitted engine step time per term",
            ["term"],
            multiprocess_mode="livemostrecent",
        )


_prom: _Prom | None = None
_prom_lock = threading.Lock()


def _get_prom() -> _Prom | None:
    global _prom
    with _prom_lock:
        if _prom is None:
            try:
                _prom = _Prom()
            except ImportError:
                return None
        return _prom


class DrafterMetrics:
    """Thread-safe counters of one process (see the module docstring)."""

    def __init__(self, *, prometheus: bool = True) -> None:
        self._lock = threading.Lock()
        self._prom = _get_prom() if prometheus else None
        self.reset()

    def reset(self) -> None:
        """Zero the Python counters (the Prometheus ones are monotonic and stay)."""
        with self._lock:
            self._drafted: Counter[tuple[str, str]] = Counter()
            self._accepted: Counter[tuple[str, str]] = Counter()
            self._offered = 0
            self._used = 0
            self._rejections: Counter[str] = Counter()
            self._faults: Counter[str] = Counter()
            self._steps = 0
            self._seconds = 0.0
            self._agents: set[str] = set()
            self._step_model: dict[str, float] = {}

    def agent_label(self, agent: str | None) -> str:
        """The label an agent id is counted under (bounded cardinality)."""
        if agent is None:
            return "untagged"
        with self._lock:
            if agent in self._agents:
                return agent
            if len(self._agents) < MAX_AGENT_LABELS:
                self._agents.add(agent)
                return agent
        return "other"

    def record_verified(self, agent: str, block: str, drafted: int, accepted: int) -> None:
        """Count one request's verified drafts and how many were accepted."""
        if drafted <= 0:
            return
        with self._lock:
            self._drafted[(agent, block)] += drafted
            self._accepted[(agent, block)] += accepted
        if self._prom is not None:
            self._prom.drafted.labels(agent, block).inc(drafted)
            if accepted:
                self._prom.accepted.labels(agent, block).inc(accepted)

    def record_step(self, offered: int, used: int, seconds: float) -> None:
        """Count one draft call: slots offered, tokens proposed, adapter time."""
        with self._lock:
            self._offered += offered
            self._used += used
            self._steps += 1
            self._seconds += seconds
        if self._prom is not None:
            self._prom.offered.inc(offered)
            self._prom.used.inc(used)
            self._prom.steps.inc()
            self._prom.seconds.observe(seconds)

    def record_step_model(self, fixed: float, token: float, kv_token: float, steps: int) -> None:
        """Publish the engine's fitted step time (seconds per step / token / KV token)."""
        with self._lock:
            self._step_model = {
                "fixed": fixed,
                "token": token,
                "kv_token": kv_token,
                "steps": float(steps),
            }
        if self._prom is not None:
            self._prom.step_model.labels("fixed").set(fixed)
            self._prom.step_model.labels("token").set(token)
            self._prom.step_model.labels("kv_token").set(kv_token)

    def record_tag_rejection(self, reason: str) -> None:
        """Count a request that runs tag-free because its tags were rejected."""
        with self._lock:
            self._rejections[reason] += 1
        if self._prom is not None:
            self._prom.rejections.labels(reason).inc()

    def record_fault(self, kind: str) -> None:
        """Count a proposer exception."""
        with self._lock:
            self._faults[kind] += 1
        if self._prom is not None:
            self._prom.faults.labels(kind).inc()

    def snapshot(self) -> MetricsSnapshot:
        """A consistent copy of the counters."""
        with self._lock:
            return MetricsSnapshot(
                drafted={f"{a}/{b}": n for (a, b), n in self._drafted.items()},
                accepted={f"{a}/{b}": n for (a, b), n in self._accepted.items()},
                budget_offered=self._offered,
                budget_used=self._used,
                tag_rejections=dict(self._rejections),
                faults=dict(self._faults),
                draft_steps=self._steps,
                proposer_seconds=self._seconds,
                step_model=dict(self._step_model),
            )


_metrics: DrafterMetrics | None = None
_metrics_lock = threading.Lock()


def get_metrics() -> DrafterMetrics:
    """This process's counters (created on first use)."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            _metrics = DrafterMetrics()
        return _metrics
