"""Replay what-if: R engine replicas behind a router, with and without query affinity.

``agentspec replay --replicas 2,4,8 --routing affinity,round-robin`` splits each
workload's calls over R replicas and replays every replica's share with
:func:`~agentspec_mw.replay.sim.replay_workload`: its own proposer (its own drafting
history), its own share of the batch (``ceil(batch / R)`` runs in flight) and its own KV
cache, all on the cost model's hardware. The routings:

* ``affinity``: every call of a run (a query) goes to one replica, chosen by a hash of the
  run id -- what vllm-router's ``consistent_hash`` does with the adapter's ``x-session-id``
  (:mod:`agentspec_mw_langgraph.routing`). Loads can be uneven: a hash does not balance.
* ``round-robin``: the ``j``-th group of the ``i``-th run goes to replica
  ``(i + j) mod R``, a group being a call with the calls issued together with it
  (``ReplayCall.with_previous``: fan-out siblings, the samples of one request): a run's
  consecutive groups land on different replicas and the loads are even (up to the
  groups' sizes) -- a router that spreads requests with no key. A group stays on one
  replica: split, a sibling's previous call on its replica would be another call of the
  run (one it follows, not one it arrives with), and the replica would issue the two
  together.

What it does not model: a call that waits for its run's previous call on another
replica (each replica replays its share of a run as a run of its own, so cross-replica
waits are absent), a router spreading one group's siblings, and the router's time. The
cluster's time is the slowest replica's (``sim_time_s`` = the maximum), its throughput
all output tokens over that time; speedups are over the same split replayed with no
speculation. ``max_in_flight`` and ``effective_batch`` are a replica's (the most calls in
flight in one replica's engine step; the mean requests emitting tokens per engine step
over every replica's steps), so ``batch_filled`` compares the effective batch with
``replica_batch`` (``ceil(batch / R)``, the runs each replica holds in flight), not with
the cluster's ``batch``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.report import plot_path
from agentspec_mw.replay.run import (
    ALL,
    FILLED,
    ReplayConfig,
    ResultRow,
    check_workloads,
    merge_runs,
    result_row,
    serving_limits,
)
from agentspec_mw.replay.sim import ReplayCall, WorkloadRun, replay_workload

__all__ = [
    "ROUTINGS",
    "ReplicaRow",
    "Routing",
    "format_replica_table",
    "parse_routings",
    "plot_replicas",
    "check_replica_batches",
    "replica_batch",
    "run_replica_replay",
    "split_calls",
]

Routing = Literal["affinity", "round-robin"]
ROUTINGS: tuple[Routing, ...] = ("affinity", "round-robin")


class ReplicaRow(ResultRow):
    """A :class:`~agentspec_mw.replay.run.ResultRow` of a cluster of replicas."""

    replicas: int
    routing: str
    replica_calls: list[int]
    """Calls each replica served."""
    replica_batch: int = 0
    """Runs each replica holds in flight (``ceil(batch / replicas)``, at least 1): the
    batch each replica is replayed at. ``max_in_flight`` and ``effective_batch`` are a
    replica's, and ``batch_filled`` is ``effective_batch >= 0.8 * replica_batch``
    (reports without this field, up to 2026-12-06, compared it with ``batch``: their rows
    with ``replicas > 1`` read as unfilled)."""


def parse_routings(text: str) -> list[Routing]:
    """``"affinity,round-robin"`` as a list of routings.

    Raises:
        ValueError: an item is not a routing.
    """
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in ROUTINGS]
    if bad or not items:
        raise ValueError(f"routing {text!r}: give a comma list of {', '.join(ROUTINGS)}")
    return [r for r in ROUTINGS if r in items]


def _replica_of(run_id: str, replicas: int) -> int:
    digest = hashlib.sha256(run_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % replicas


def check_replica_batches(batches: Sequence[int], replicas: Sequence[int]) -> None:
    """Refuse a cluster batch smaller than a replica count: each replica would still run a
    whole run at a time, and the row would say batch ``b`` while ``R`` runs decode at once.

    Raises:
        ValueError: some batch is under some replica count.
    """
    small = [(b, r) for b in batches for r in replicas if b < r]
    if small:
        b, r = small[0]
        raise ValueError(
            f"batch {b} is smaller than {r} replicas: the batch is the cluster's, at least "
            "one run per replica (each holds ceil(batch / R)); raise --batch or lower --replicas"
        )


def replica_batch(batch: int, replicas: int) -> int:
    """Runs each of ``replicas`` replicas holds in flight for a cluster ``batch``."""
    return max(1, math.ceil(batch / replicas))


def split_calls(
    calls: Sequence[ReplayCall], replicas: int, routing: Routing
) -> list[list[ReplayCall]]:
    """Each replica's calls (each keeps file order); see the module docstring. With
    ``round-robin`` a call issued together with the previous call of its run
    (``with_previous``) goes where that call went: the ``j`` counting a run's calls is
    that of its groups, so on its replica ``with_previous`` still names the call it
    arrives with.

    Raises:
        ValueError: ``replicas < 1`` or an unknown ``routing``.
    """
    if replicas < 1:
        raise ValueError(f"replicas={replicas} must be >= 1")
    if routing not in ROUTINGS:
        raise ValueError(f"routing={routing!r} is not one of {', '.join(ROUTINGS)}")
    shares: list[list[ReplayCall]] = [[] for _ in range(replicas)]
    run_index: dict[str, int] = {}
    groups: dict[str, int] = {}  # run -> groups routed so far
    home: dict[str, int] = {}  # run -> the replica of its current group
    for call in calls:
        if routing == "affinity":
            shares[_replica_of(call.run_id, replicas)].append(call)
            continue
        run = call.run_id
        if not (call.with_previous and run in home):  # a group starts
            i = run_index.setdefault(run, len(run_index))
            j = groups.get(run, 0)
            groups[run] = j + 1
            home[run] = (i + j) % replicas
        shares[home[run]].append(call)
    return shares


def _cluster(runs: Sequence[WorkloadRun]) -> WorkloadRun:
    """Replicas run side by side: counts add up, the time is the slowest replica's."""
    out = merge_runs(runs)
    out.sim_time_s = max((r.sim_time_s for r in runs), default=0.0)
    return out


def _replay_split(
    shares: Sequence[Sequence[ReplayCall]],
    name: str,
    env: ProposerEnv,
    config: ReplayConfig,
    batch: int,
    k: int,
    on_tokens: Callable[[int], None] | None = None,
) -> WorkloadRun:
    cost = get_cost_model(config.cost_model)
    per_replica = replica_batch(batch, len(shares))
    runs = []
    for share in shares:
        proposer = make_proposer(name, env, **config.proposer_options.get(name, {}))
        runs.append(
            replay_workload(
                share,
                proposer,
                batch=per_replica,
                k=0 if name == "none" else k,
                cost_model=cost,
                limits=serving_limits(config),
                add_proposer_time=config.add_proposer_time and name != "none",
                on_tokens=on_tokens,
            )
        )
    return _cluster(runs)


def run_replica_replay(
    config: ReplayConfig,
    workloads: dict[str, list[ReplayCall]],
    replicas: Sequence[int],
    routings: Sequence[Routing] = ROUTINGS,
    env: ProposerEnv | None = None,
    *,
    progress: bool = False,
) -> list[ReplicaRow]:
    """Replay every proposer × workload × batch × k × replicas × routing (module doc);
    speedups are over ``none`` on the same split. ``ALL`` rows add the workloads up
    (their time: the workloads one after another). ``progress``: a bar of the output
    tokens replayed, as :func:`~agentspec_mw.replay.run.run_replay`'s.

    Raises:
        ValueError: a workload without output tokens
            (:func:`~agentspec_mw.replay.run.check_workloads`), or a batch smaller than a
            replica count (each replica would still run a whole run at a time: the row
            would say batch ``b`` while ``R`` runs decode at once).
    """
    check_workloads(workloads)
    check_replica_batches(config.batch, replicas)
    cost = get_cost_model(config.cost_model)
    env = env or ProposerEnv(cost_model=cost, max_k=max(config.k))
    names = [p for p in dict.fromkeys(config.proposers) if p != "none"]
    tokens = sum(len(c.output) for calls in workloads.values() for c in calls)
    passes = len(replicas) * len(routings) * len(config.batch) * (1 + len(names) * len(config.k))
    rows: list[ReplicaRow] = []
    with tqdm(total=tokens * passes, desc="replay", unit=" tok", disable=not progress) as bar:
        for r in replicas:
            for routing in routings:
                for batch in config.batch:
                    splits = {w: split_calls(c, r, routing) for w, c in workloads.items()}
                    bar.set_postfix_str(f"none R={r} {routing} b={batch}")
                    base = {
                        w: _replay_split(s, "none", env, config, batch, 0, bar.update)
                        for w, s in splits.items()
                    }
                    base_all = merge_runs(list(base.values()))
                    for name in names:
                        for k in config.k:
                            bar.set_postfix_str(f"{name} R={r} {routing} b={batch} k={k}")
                            runs = {
                                w: _replay_split(s, name, env, config, batch, k, bar.update)
                                for w, s in splits.items()
                            }
                            rows += _rows(name, batch, k, r, routing, runs, base, splits)
                            merged = merge_runs(list(runs.values()))
                            rows += _rows(
                                name, batch, k, r, routing, {ALL: merged}, {ALL: base_all}, splits
                            )
    return rows


def _rows(
    name: str,
    batch: int,
    k: int,
    replicas: int,
    routing: str,
    runs: dict[str, WorkloadRun],
    base: dict[str, WorkloadRun],
    splits: dict[str, list[list[ReplayCall]]],
) -> list[ReplicaRow]:
    """The rows of ``runs`` (a workload's, or ``ALL``: every workload's) over ``base``;
    ``batch_filled`` against the replicas' batch (:class:`ReplicaRow`)."""
    out = []
    per_replica = replica_batch(batch, replicas)
    for wl, run in runs.items():
        row = result_row(name, wl, batch, k, run, base[wl].sim_time_s)
        row.batch_filled = run.effective_batch >= FILLED * per_replica
        calls = (
            [len(s) for s in splits[wl]]
            if wl != ALL
            else [sum(len(s[i]) for s in splits.values()) for i in range(replicas)]
        )
        out.append(
            ReplicaRow(
                **row.model_dump(),
                replicas=replicas,
                routing=routing,
                replica_calls=calls,
                replica_batch=per_replica,
            )
        )
    return out


def format_replica_table(rows: Sequence[ReplicaRow]) -> str:
    """A text table: one line per row (``accept`` is ``-`` where nothing was drafted;
    ``eff/rep`` is a replica's effective batch over the batch each replica holds, marked
    ``*`` where that is under 80 %: not a replay at that batch, as in the replay's table)."""
    head = (
        f"{'proposer':<10} {'workload':<22} {'R':>2} {'routing':<11} {'batch':>5} {'k':>2} "
        f"{'accept':>6} {'MAT':>5} {'speedup':>7} {'tok/s':>8} {'eff/rep':>11}"
    )
    lines = [head, "-" * len(head)]
    for x in rows:
        accept = f"{1 - x.rejection_rate:>6.3f}" if x.drafted_per_step > 0 else f"{'-':>6}"
        mark = "" if x.batch_filled else "*"
        eff = f"{x.effective_batch:.1f}{mark}/{x.replica_batch}"
        lines.append(
            f"{x.proposer:<10} {x.workload[:22]:<22} {x.replicas:>2} {x.routing:<11} "
            f"{x.batch:>5} {x.k:>2} {accept} {x.mat:>5.2f} "
            f"{x.speedup:>7.3f} {x.throughput_tok_s:>8.1f} {eff:>11}"
        )
    if any(not x.batch_filled for x in rows):
        lines.append(
            "* a replica's effective batch under 80 % of the runs it holds: the workload has "
            "fewer runs, or its KV cache holds fewer contexts"
        )
    return "\n".join(lines)


def plot_replicas(rows: Sequence[ReplicaRow], path: str | Path, title: str) -> Path:
    """Speedup over no speculation vs replicas: a colour per workload, solid for
    affinity, dashed for round robin; returns the file written
    (:func:`~agentspec_mw.replay.report.plot_path` of ``path``)."""
    out = plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    for x in rows:
        series.setdefault((x.proposer, x.workload, x.routing), []).append((x.replicas, x.speedup))
    colors: dict[tuple[str, str], str] = {}
    for (prop, wl, routing), pts in sorted(series.items()):
        pts.sort()
        color = colors.setdefault((prop, wl), f"C{len(colors) % 10}")  # one per workload
        style = "-" if routing == "affinity" else "--"
        label = f"{prop} {wl} {routing}"
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, style, color=color, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas")
    ax.set_ylabel("speedup over no speculation")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
