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
* ``agentspec_expected_accepted_tokens_total{agent,block}`` — what the proposer expected
  of those: the sum of each verified position's predicted survival (the probability that
  it and every position before it are accepted), for drafts that carry the proposer's
  per-token estimates (AgentSpec's do; the n-gram and SuffixDecoding drafts do not, and
  count here as nothing). Against ``accepted_tokens`` it is a live calibration check: a
  proposer whose estimates hold on this model expects what it gets;
* ``agentspec_budget_offered_tokens_total`` — the per-row caps offered to the proposer
  (``k``, less near ``max_model_len`` or a request's ``max_tokens``), summed over rows and steps;
* ``agentspec_budget_used_tokens_total`` — draft tokens the proposer returned;
* ``agentspec_tag_rejections_total{reason}`` — requests whose wire tags were rejected
  (they ran tag-free);
* ``agentspec_proposer_faults_total{kind}`` — proposer exceptions (``kind`` = verb and
  exception type); that step got no drafts;
* ``agentspec_proposer_seconds`` — a histogram of the adapter's time per draft call;
* ``agentspec_draft_steps_total`` — draft calls;
* ``agentspec_step_model_seconds{term}`` — with ``cost_model="measured"``, the engine's
  fitted step time: ``term="fixed"`` (seconds per step), ``"token"`` (per batched token),
  ``"kv_token"`` (per resident KV-cache token), ``"spec_kv_token"`` (per KV token of a
  request that carries a draft), ``"draft_kv_token"`` (per draft token per KV token of
  its request) and ``"emitted_token"`` (per token the step emitted; not in the budget's
  price, see :mod:`agentspec_mw.costfit`).

Label values are tenant-safe: every ``agent``, ``block`` and ``scope`` value is reduced to
printable ASCII without quotes or backslashes (other characters become ``_``) and cut to
:data:`MAX_LABEL_CHARS`; at most :data:`MAX_AGENT_LABELS` agents, :data:`MAX_BLOCK_LABELS`
client-defined blocks and :data:`MAX_SCOPE_LABELS` scopes get their own value, later ones
count as ``other`` (the segment names, ``none`` and the proposer's default block names
never do). ``block`` is the block type the proposer reports for the request
(``block_of(req_id)``, when it has one), else the tag's ``segment``, else ``none``.

Which request identities label the counters is the operator's choice,
:data:`LABELS_ENV` (``AGENTSPEC_METRICS_LABELS``, a comma list; ``agentspec serve
--metrics-labels``) read when the process's counters are made, or
:meth:`DrafterMetrics.set_labels`:

* ``agent`` (the default without scope binding): ``agent`` is the tag's ``agent_id``
  (``untagged`` without tags or with scope-only tags). Without it every tagged request
  counts as ``agent="tagged"`` — the default of ``agentspec serve`` with scope binding,
  since ``/metrics`` is not authenticated and agent ids are tenants' data.
* ``scope``: also ``agentspec_scope_drafted_tokens_total{scope}`` and
  ``agentspec_scope_accepted_tokens_total{scope}`` per isolation scope (off by default:
  scopes name tenants).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

__all__ = [
    "LABELS_ENV",
    "MAX_AGENT_LABELS",
    "MAX_BLOCK_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_SCOPE_LABELS",
    "METRIC_LABELS",
    "DrafterMetrics",
    "SURVIVAL_BINS",
    "MetricsSnapshot",
    "Verified",
    "get_metrics",
    "parse_labels",
]

logger = logging.getLogger("agentspec_mw_vllm.metrics")

MAX_AGENT_LABELS = 64
MAX_BLOCK_LABELS = 32
MAX_SCOPE_LABELS = 64
MAX_LABEL_CHARS = 48
#: ``agentspec_step_model_seconds``'s ``term`` label values, in ``record_step_model``'s order
_STEP_TERMS = ("fixed", "token", "kv_token", "spec_kv_token", "draft_kv_token", "emitted_token")
LABELS_ENV = "AGENTSPEC_METRICS_LABELS"
METRIC_LABELS = ("agent", "scope")
"""The request identities that can label the counters."""
#: Block labels that are never capped: segments, ``none`` and the proposer's default
#: block names (``agentspec_mw.agentspec.blocks.DEFAULT_BLOCKS`` and ``ROOT``).
_FIXED_BLOCKS = frozenset(
    ("plan", "tool_call", "observation", "answer", "other", "none", "text", "code", "think")
    + ("json_call", "thought", "action")
)
_SAFE = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}


def _clean(text: str) -> str:
    """A label value: printable ASCII without quotes/backslashes, at most MAX_LABEL_CHARS."""
    out = "".join(c if c in _SAFE else "_" for c in text[:MAX_LABEL_CHARS])
    return out or "_"


def parse_labels(spec: str | Iterable[str]) -> frozenset[str]:
    """``"agent,scope"`` (or an iterable) as a set of :data:`METRIC_LABELS`; ``""`` or
    ``"none"``: neither. Raises ``ValueError`` naming an unknown one."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out = {n.strip() for n in names if n.strip() and n.strip() != "none"}
    unknown = out - set(METRIC_LABELS)
    if unknown:
        raise ValueError(
            f"metrics labels {sorted(unknown)} unknown: choose from {list(METRIC_LABELS)} "
            "(comma-separated) or none"
        )
    return frozenset(out)


def _labels_from_env() -> str:
    """:data:`LABELS_ENV`, or ``"agent"`` when it is unset or invalid (with a warning)."""
    value = os.environ.get(LABELS_ENV, "agent")
    try:
        parse_labels(value)
    except ValueError as exc:
        logger.warning(
            "ignoring %s=%r (%s); the agentspec_* counters are labelled by agent. Fix or "
            "unset the variable (or pass agentspec serve --metrics-labels).",
            LABELS_ENV,
            value,
            exc,
        )
        return "agent"
    return value


class _Capped:
    """First ``cap`` distinct cleaned values keep their label, later ones are ``other``.

    A value's label never changes once given (``seen`` only grows), so the labels of the
    first :data:`_MEMO_VALUES` raw values are remembered: the per-step path (a request's
    block, every verified draft) cleans each value once."""

    def __init__(self, cap: int, fixed: frozenset[str] = frozenset()) -> None:
        self.cap = cap
        self.fixed = fixed
        self.seen: set[str] = set()
        self._memo: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        label = self._memo.get(value)
        if label is not None:
            return label
        label = _clean(value)
        if label not in self.fixed and label not in self.seen:
            if len(self.seen) < self.cap:
                self.seen.add(label)
            else:
                label = "other"
        if len(self._memo) < _MEMO_VALUES:
            self._memo[value] = label
        return label


SURVIVAL_BINS = 10
"""Rows of :attr:`MetricsSnapshot.reliability`: tenths of predicted survival."""

_SMALL_BIN = 32
"""Up to this many positions :meth:`DrafterMetrics._bin` loops in Python (numpy's fixed
cost per call is larger)."""


def _check_survivals(surv: list[float]) -> list[float] | np.ndarray:
    """``surv`` as :meth:`DrafterMetrics._bin` takes it (an array above :data:`_SMALL_BIN`
    positions); ``ValueError`` unless every value is a number in [0, 1] (NaN fails)."""
    try:
        if len(surv) <= _SMALL_BIN:
            total = sum(surv)  # a NaN can hide from min and max, never from the sum
            ok = not surv or (0.0 <= min(surv) and max(surv) <= 1.0 and total == total)
            if ok:
                return surv
        else:
            s = np.asarray(surv, dtype=np.float64)
            if ((s >= 0.0) & (s <= 1.0)).all():
                return s
    except (TypeError, ValueError):  # e.g. a string among them
        pass
    raise ValueError(f"survivals must be numbers in [0, 1]: {surv!r:.120}")


Verified = tuple[str, str, int, int, str | None, Sequence[float] | None]
"""One request's verified draft, :meth:`DrafterMetrics.record_verified`'s arguments in
order: agent label, block, drafted, accepted, scope label, survival."""

_MEMO_VALUES = 4096
"""Raw label values whose label :class:`_Capped` remembers (a bound: values are tenants')."""


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
    scope_drafted: dict[str, int] = {}
    """Draft tokens verified per scope label (only with scope labels on)."""
    scope_accepted: dict[str, int] = {}
    """Of those, accepted per scope label."""
    step_model: dict[str, float] = {}
    """The fitted step time when the adapter measures it, else empty: seconds per step
    (``fixed``), per batched token (``token``), per KV token (``kv_token``), per KV token of
    a drafting request (``spec_kv_token``), per draft token x its request's KV token
    (``draft_kv_token``) and per emitted token (``emitted_token``), and the ``steps``
    timed (:meth:`DrafterMetrics.record_step_model`'s arguments)."""
    estimated: dict[str, int] = {}
    """Draft tokens verified that carried the proposer's estimate."""
    expected: dict[str, float] = {}
    """Of those, the accepted tokens the proposer expected (the sum of their survivals)."""
    estimated_accepted: dict[str, int] = {}
    """Of those, the tokens accepted."""
    reliability: tuple[tuple[int, float, int], ...] = ()
    """Per tenth of predicted survival (0–0.1 … 0.9–1.0): verified positions, the sum of
    their predicted survivals, how many were accepted (:data:`SURVIVAL_BINS` rows, or
    empty before the first estimate)."""

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
        self.expected = PCounter(
            "agentspec_expected_accepted_tokens",
            "Accepted draft tokens the proposer expected (sum of predicted survivals)",
            ["agent", "block"],
        )
        self.scope_drafted = PCounter(
            "agentspec_scope_drafted_tokens", "Draft tokens verified per scope", ["scope"]
        )
        self.scope_accepted = PCounter(
            "agentspec_scope_accepted_tokens", "Draft tokens accepted per scope", ["scope"]
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
        # labelled children by label values, made on first use (``labels()`` takes a lock
        # and converts every value each call; a child, once made, is the same object)
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, cached (the label values are bounded, see
        :class:`DrafterMetrics`)."""
        key = (metric, values)
        kid = self._children.get(key)
        if kid is None:
            kid = self._children[key] = metric.labels(*values)
        return kid


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
    """Thread-safe counters of one process (see the module docstring).

    ``labels``: which of :data:`METRIC_LABELS` label the counters (default: the
    :data:`LABELS_ENV` environment variable, else ``{"agent"}``; an invalid environment
    value is logged as a warning and ``{"agent"}`` used: these counters are made inside
    the engine, which must not fail over its metrics).

    Raises:
        ValueError: ``labels`` (given) names an unknown label.
    """

    def __init__(
        self, *, prometheus: bool = True, labels: str | Iterable[str] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._prom = _get_prom() if prometheus else None
        self._published: tuple[float, ...] | None = None
        """The step-time fit last set on the gauges."""
        self._agents = _Capped(MAX_AGENT_LABELS)
        self._blocks = _Capped(MAX_BLOCK_LABELS, _FIXED_BLOCKS)
        self._scopes = _Capped(MAX_SCOPE_LABELS)
        self.set_labels(_labels_from_env() if labels is None else labels)
        self.reset()

    def set_labels(self, labels: str | Iterable[str]) -> None:
        """Choose the request identities that label the counters (see module doc)."""
        self.labels = parse_labels(labels)

    def reset(self) -> None:
        """Zero the Python counters (the Prometheus ones are monotonic and stay, and so do
        the label values already handed out)."""
        with self._lock:
            self._drafted: Counter[tuple[str, str]] = Counter()
            self._accepted: Counter[tuple[str, str]] = Counter()
            self._scope_drafted: Counter[str] = Counter()
            self._scope_accepted: Counter[str] = Counter()
            self._offered = 0
            self._used = 0
            self._rejections: Counter[str] = Counter()
            self._faults: Counter[str] = Counter()
            self._steps = 0
            self._seconds = 0.0
            self._step_model: dict[str, float] = {}
            self._estimated: Counter[tuple[str, str]] = Counter()
            self._expected: defaultdict[tuple[str, str], float] = defaultdict(float)
            self._estimated_accepted: Counter[tuple[str, str]] = Counter()
            self._bins: list[list[float]] | None = None

    def agent_label(self, agent: str | None) -> str:
        """The label an agent id is counted under: ``untagged`` for ``None``, ``tagged``
        when agent labels are off, else the cleaned id (bounded cardinality)."""
        if agent is None:
            return "untagged"
        if "agent" not in self.labels:
            return "tagged"
        with self._lock:
            return self._agents(agent)

    def scope_label(self, scope: str | None) -> str | None:
        """The label a scope is counted under (``default`` for ``None``); ``None`` when
        scope labels are off."""
        if "scope" not in self.labels:
            return None
        with self._lock:
            return self._scopes("default" if scope is None else scope)

    def record_verified(
        self,
        agent: str,
        block: str,
        drafted: int,
        accepted: int,
        scope: str | None = None,
        survival: Sequence[float] | None = None,
    ) -> None:
        """Count one request's verified drafts and how many were accepted (``agent`` and
        ``scope`` as returned by :meth:`agent_label` / :meth:`scope_label`; ``block`` is
        cleaned and capped here). ``survival``: the proposer's predicted survival of each
        of the ``drafted`` positions, when its draft carried estimates (else ``None``)."""
        self.record_verified_many([(agent, block, drafted, accepted, scope, survival)])

    def record_verified_many(self, rows: Sequence[Verified]) -> None:
        """:meth:`record_verified` for each of ``rows`` (one draft call's verified
        requests), under one lock and with one Prometheus update per label set: the
        adapter's per-step path. Raises ``ValueError`` (counting nothing) if a row's
        ``survival`` does not hold one number in [0, 1] per drafted token (NaN included)."""
        rows = [r for r in rows if r[2] > 0]
        if not rows:
            return
        surv: list[float] = []  # every estimated position, row after row
        est_lens: list[int] = []
        est_acc: list[int] = []
        for _agent, _block, drafted, accepted, _scope, survival in rows:
            if survival is not None:
                if len(survival) != drafted:
                    raise ValueError(f"{len(survival)} survivals for {drafted} drafted tokens")
                surv.extend(survival)
                est_lens.append(drafted)
                est_acc.append(accepted)
        flat = _check_survivals(surv)
        # per label set: drafted, accepted, and of the drafts with estimates: drafted,
        # accepted; and their expected accepted tokens
        by_key: dict[tuple[str, str], list[int]] = {}
        expect: dict[tuple[str, str], float] = {}
        by_scope: dict[str, list[int]] = {}
        with self._lock:
            blocks = self._blocks
            for agent, block, drafted, accepted, scope, survival in rows:
                key = (agent, blocks(block))
                tot = by_key.get(key)
                if tot is None:
                    tot = by_key[key] = [0, 0, 0, 0]
                    expect[key] = 0.0
                tot[0] += drafted
                tot[1] += accepted
                if survival is not None:
                    tot[2] += drafted
                    tot[3] += accepted
                    expect[key] += float(sum(survival))
                if scope is not None:
                    sums = by_scope.get(scope)
                    if sums is None:
                        sums = by_scope[scope] = [0, 0]
                    sums[0] += drafted
                    sums[1] += accepted
            for key, (drafted, accepted, n_est, est_acc_n) in by_key.items():
                self._drafted[key] += drafted
                self._accepted[key] += accepted
                if n_est:
                    self._estimated[key] += n_est
                    self._expected[key] += expect[key]
                    self._estimated_accepted[key] += est_acc_n
            for scope, (drafted, accepted) in by_scope.items():
                self._scope_drafted[scope] += drafted
                self._scope_accepted[scope] += accepted
            if surv:
                self._bin(flat, est_lens, est_acc)
        prom = self._prom
        if prom is not None:
            for (agent, block), (drafted, accepted, _n, _a) in by_key.items():
                prom.child(prom.drafted, agent, block).inc(drafted)
                if accepted:
                    prom.child(prom.accepted, agent, block).inc(accepted)
                expected = expect[(agent, block)]
                if expected > 0:
                    prom.child(prom.expected, agent, block).inc(expected)
            for scope, (drafted, accepted) in by_scope.items():
                prom.child(prom.scope_drafted, scope).inc(drafted)
                if accepted:
                    prom.child(prom.scope_accepted, scope).inc(accepted)

    def _bin(self, surv: list[float] | np.ndarray, lens: list[int], accepted: list[int]) -> None:
        """Add estimated positions to the reliability bins (the lock held): ``surv`` the
        positions of drafts of ``lens`` tokens, of which the first ``accepted`` were
        accepted (a list up to :data:`_SMALL_BIN` positions, else an array)."""
        bins = self._bins
        if bins is None:
            bins = self._bins = [[0, 0.0, 0] for _ in range(SURVIVAL_BINS)]
        if len(surv) <= _SMALL_BIN:  # a few positions: cheaper in Python than in numpy
            p = 0
            for n_i, acc in zip(lens, accepted, strict=True):
                for j in range(n_i):
                    x = surv[p + j]
                    row = bins[min(SURVIVAL_BINS - 1, max(0, int(x * SURVIVAL_BINS)))]
                    row[0] += 1
                    row[1] += x
                    row[2] += j < acc
                p += n_i
            return
        s = np.asarray(surv, dtype=np.float64)  # already one (_check_survivals)
        n = np.asarray(lens, dtype=np.int64)
        # each position's index within its draft, against its draft's accepted count
        pos = np.arange(len(s)) - np.repeat(np.cumsum(n) - n, n)
        hit = pos < np.repeat(np.asarray(accepted, dtype=np.int64), n)
        idx = np.clip((s * SURVIVAL_BINS).astype(np.int64), 0, SURVIVAL_BINS - 1)
        count = np.bincount(idx, minlength=SURVIVAL_BINS).tolist()
        total = np.bincount(idx, weights=s, minlength=SURVIVAL_BINS).tolist()
        hits = np.bincount(idx, weights=hit, minlength=SURVIVAL_BINS).tolist()
        for row, c, t, h in zip(bins, count, total, hits, strict=True):
            row[0] += c
            row[1] += t
            row[2] += int(h)

    def record_step(self, offered: int, used: int, seconds: float) -> None:
        """Count one draft call: slots offered, tokens proposed, adapter time."""
        with self._lock:
            self._offered += offered
            self._used += used
            self._steps += 1
            self._seconds += seconds
        prom = self._prom
        if prom is not None:
            if offered:
                prom.offered.inc(offered)
            if used:
                prom.used.inc(used)
            prom.steps.inc()
            prom.seconds.observe(seconds)

    def record_step_model(
        self,
        fixed: float,
        token: float,
        kv_token: float,
        steps: int,
        spec_kv_token: float = 0.0,
        draft_kv_token: float = 0.0,
        emitted_token: float = 0.0,
    ) -> None:
        """Publish the engine's fitted step time (seconds per step / token / KV token / KV
        token of a drafting request / draft token x its request's KV token / emitted
        token).

        Called at every timed step; the Prometheus gauges are set when the fit changed
        (it changes at a refit, every few steps)."""
        terms = (fixed, token, kv_token, spec_kv_token, draft_kv_token, emitted_token)
        with self._lock:
            self._step_model = {
                "fixed": fixed,
                "token": token,
                "kv_token": kv_token,
                "spec_kv_token": spec_kv_token,
                "draft_kv_token": draft_kv_token,
                "emitted_token": emitted_token,
                "steps": float(steps),
            }
            changed = terms != self._published
            self._published = terms
        prom = self._prom
        if prom is not None and changed:
            for name, value in zip(_STEP_TERMS, terms, strict=True):
                prom.child(prom.step_model, name).set(value)

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
                scope_drafted=dict(self._scope_drafted),
                scope_accepted=dict(self._scope_accepted),
                estimated={f"{a}/{b}": n for (a, b), n in self._estimated.items()},
                expected={f"{a}/{b}": x for (a, b), x in self._expected.items()},
                estimated_accepted={
                    f"{a}/{b}": n for (a, b), n in self._estimated_accepted.items()
                },
                reliability=tuple((int(n), float(x), int(a)) for n, x, a in (self._bins or ())),
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
