"""Drive replays: proposers × workloads × batch sizes × k, with the ``none`` baseline."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from tqdm import tqdm

from agentspec_mw.costmodel import PRESETS, ServingLimits, get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import ReplayCall, WorkloadRun, replay_workload
from agentspec_mw.tags import StructureTags
from agentspec_mw.traces.loader import LoadStats
from agentspec_mw.traces.tokenized import CallMeta, TokenizedTrace

__all__ = [
    "ReplayConfig",
    "ReplayReport",
    "ResultRow",
    "MAX_K",
    "build_calls",
    "check_proposers",
    "check_workloads",
    "fewer_in_flight",
    "issued_together",
    "more_in_flight",
    "merge_runs",
    "order_runs",
    "parse_run_order",
    "result_row",
    "run_replay",
    "serving_limits",
]

ALL = "ALL"
#: A row whose effective batch is under this share of its nominal batch is marked.
FILLED = 0.8
#: The largest ``k`` (draft length) the replay takes (:attr:`ReplayConfig.k`).
MAX_K = 1024


class ReplayConfig(BaseModel):
    """What to replay and how (the ``config`` object of the JSON report)."""

    model_config = ConfigDict(extra="forbid")

    traces: list[str] = Field(min_length=1)
    """Trace files (.jsonl, .jsonl.xz, .jsonl.gz)."""
    tokenizer: str
    """A Hugging Face tokenizer name or local folder."""
    proposers: list[str] = Field(default_factory=lambda: ["none", "ngram", "suffix"], min_length=1)
    """Builtin names (none, ngram, suffix, agentspec) or dotted class paths."""
    batch: list[int] = Field(default_factory=lambda: [1, 64, 256])
    """Runs in flight at once."""
    k: list[int] = Field(default_factory=lambda: [8])
    """Maximum draft lengths, each 1 to 1024 (``MAX_K``): a step verifies a request's
    draft and its last token within the step's token budget (8192 tokens in the GPU
    presets, shared by the whole batch), and proposers size their per-request draft
    buffers by the largest ``k`` (AgentSpec's: rows × k), so a longer draft only costs
    memory (``k`` = 10^8 asked for 24 GiB)."""
    cost_model: str = "llama8b-h100"
    """Step-time model preset (see agentspec_mw.costmodel)."""
    add_proposer_time: bool = False
    """Add each step's measured proposer time to the simulated step (not deterministic)."""
    tags: Literal["trace", "none"] = "trace"
    """``trace``: agent, run and parent group from the records; ``none``: tag-free."""
    proposer_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-proposer constructor options, e.g. ``{"suffix": {"min_token_prob": 0.1}}``."""
    max_calls: int | None = Field(default=None, ge=1)
    """Keep only the first N calls of each workload (quick runs)."""
    max_calls_per_run: int | None = Field(default=None, ge=1)
    """Keep only the first N calls of each run (a subset that keeps every run)."""
    max_runs: int | None = Field(default=None, ge=1)
    """Keep only the first N runs of each workload, whole (a trace with fewer runs than
    the batch size: never that many calls in flight)."""
    skip_malformed: bool = False
    """Count and skip malformed records instead of failing."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    """Override the preset's token budget per step (vLLM's ``--max-num-batched-tokens``)."""
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    """Override the preset's KV-cache capacity in tokens (what vLLM logs as its KV cache
    size at start-up)."""
    serial_runs: bool = False
    """Replay every run's calls one after another, as the replay did before 2026-12-05.
    By default calls the trace marks as issued together (fan-out siblings, the samples of
    one request: :func:`issued_together`) arrive together, as they reach a server; one
    after another, each sibling could draft from its siblings' finished outputs, which
    live it cannot (they decode at the same time)."""
    run_order: str = "file"
    """The order the runs of a workload are admitted in: ``file`` (the order they first
    appear), ``reversed``, or ``shuffle:SEED`` (a seeded permutation). Each run's calls
    keep their order. Applied after the ``max_*`` subsets, which take runs in file order.
    Another order is another arrival pattern of the same work: a check that results do
    not hang on the order of one file."""

    @field_validator("batch", "k")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or any(x < 1 for x in v):
            raise ValueError(f"values must be >= 1, got {v}")
        return sorted(set(v))

    @field_validator("k")
    @classmethod
    def _bounded_k(cls, v: list[int]) -> list[int]:
        if max(v) > MAX_K:
            raise ValueError(
                f"values must be <= {MAX_K} (a draft is verified within one step's token "
                f"budget; proposers size their draft buffers by k), got {v}"
            )
        return v

    @field_validator("run_order")
    @classmethod
    def _order(cls, v: str) -> str:
        parse_run_order(v)
        return v

    @field_validator("cost_model")
    @classmethod
    def _preset(cls, v: str) -> str:
        if v not in PRESETS:
            raise ValueError(f"cost_model={v!r} is not a preset; choose one of {sorted(PRESETS)}")
        return v

    @model_validator(mode="after")
    def _options_of_replayed_proposers(self) -> ReplayConfig:
        unknown = [name for name in self.proposer_options if name not in self.proposers]
        if unknown:
            raise ValueError(
                f"proposer_options (--set) name {', '.join(map(repr, unknown))}, not among the "
                f"proposers replayed ({', '.join(self.proposers)}): they would be ignored; "
                "fix the proposer name or add it to the proposers (--proposers)"
            )
        return self

    @model_validator(mode="after")
    def _kv_capacity_holds_a_block(self) -> ReplayConfig:
        if self.kv_capacity_tokens is not None:
            block = get_cost_model(self.cost_model).limits.block_size
            if self.kv_capacity_tokens < block:
                raise ValueError(
                    f"kv_capacity_tokens (--kv-capacity) = {self.kv_capacity_tokens} holds "
                    f"no KV block: the {self.cost_model} preset's blocks are {block} tokens"
                )
        return self


class ResultRow(BaseModel):
    """One proposer × workload × batch × k result (``workload == "ALL"``: the aggregate)."""

    proposer: str
    workload: str
    batch: int
    k: int
    calls: int
    output_tokens: int
    steps: int
    mat: float
    rejection_rate: float
    drafted_per_step: float
    propose_us_p50: float
    """Median proposer time (its start, propose, extend and stop calls, wall clock, µs) of
    the engine steps at which ``propose`` ran (``propose_steps``); 0 where none did. Reports
    without ``propose_steps`` (before 2026-12-06 09:00 UTC) counted every engine step,
    those with no propose too (prefill-only steps), which pulled both toward 0."""
    propose_us_p99: float
    """99th percentile of the same steps' proposer time, µs."""
    speedup: float
    max_in_flight: int = 0
    """Most calls in flight in one engine step: below ``batch`` when the workload has
    fewer runs than that, or when the KV cache holds fewer (``kv_waits``, ``preemptions``);
    its "batch" row is then a replay at this smaller batch."""
    effective_batch: float = 0.0
    """Mean requests emitting tokens per engine step (fewer than ``batch`` when the
    workload has fewer runs, while prompts prefill, or when the KV cache holds fewer)."""
    batch_filled: bool = True
    """``effective_batch >= 0.8 * batch``: otherwise the row is not a replay at ``batch``."""
    throughput_tok_s: float = 0.0
    """Output tokens per simulated second (all calls, first arrival to last end)."""
    ttft_p50_s: float = 0.0
    """Median time from a call's arrival to its first token (queueing + prefill), s."""
    ttft_p99_s: float = 0.0
    tpot_p50_s: float = 0.0
    """Median per-call time per output token after the first, s."""
    tpot_p99_s: float = 0.0
    prefill_tokens: int = 0
    """Prompt tokens computed (not found in the prefix cache; recomputation included)."""
    prefix_hit_rate: float = 0.0
    """Prompt tokens found in the prefix cache / prompt tokens."""
    preemptions: int = 0
    """Requests preempted for KV space (recomputed later)."""
    kv_waits: int = 0
    """Engine steps in which the next waiting call did not fit in the KV cache."""
    sim_time_s: float = 0.0
    """Simulated seconds of the whole workload."""
    propose_steps: int = 0
    """Engine steps at which the proposer's ``propose`` ran (a decoding request and
    ``k >= 1``): the steps ``propose_us_p50``/``p99`` cover (0 for ``none``)."""


class ReplayReport(BaseModel):
    """The ``--json`` output (version 1; fields are only ever added)."""

    version: int = 1
    limits: dict[str, Any] = Field(default_factory=dict)
    """The cost model's serving limits the replay enforced (token budget, KV capacity...)."""
    config: ReplayConfig
    results: list[ResultRow]
    load: dict[str, Any] = Field(default_factory=dict)


def _tags_for(meta: Any, mode: str) -> StructureTags | None:
    if mode == "none":
        return None
    return StructureTags(
        agent_id=meta.agent,
        query_id=meta.run_id,
        group_id=meta.parent_group,
        group_kind="retry" if meta.parent_group else None,
    )


def parse_run_order(order: str) -> int | None:
    """``None`` for ``file``, ``-1`` for ``reversed``, the seed for ``shuffle:SEED``."""
    if order == "file":
        return None
    if order == "reversed":
        return -1
    kind, _, seed = order.partition(":")
    if kind == "shuffle" and seed.isdigit():
        return int(seed)
    raise ValueError(f"run_order={order!r}: expected 'file', 'reversed' or 'shuffle:SEED'")


def order_runs(calls: Sequence[ReplayCall], order: str) -> list[ReplayCall]:
    """``calls`` with their runs in ``order`` (see :attr:`ReplayConfig.run_order`); the
    calls of a run stay in their order."""
    how = parse_run_order(order)
    if how is None:
        return list(calls)
    runs: dict[str, list[ReplayCall]] = {}
    for c in calls:
        runs.setdefault(c.run_id, []).append(c)
    ids = list(runs)
    if how < 0:
        ids.reverse()
    else:
        ids = [ids[i] for i in np.random.default_rng(how).permutation(len(ids))]
    return [c for rid in ids for c in runs[rid]]


def issued_together(
    prev: CallMeta, meta: CallMeta, prev_prompt: np.ndarray, prompt: np.ndarray
) -> bool:
    """Whether the trace says call ``meta`` (prompt token ids ``prompt``) was issued
    together with ``prev``, the call before it in its run: both in one redundancy group
    (``parent_group``), ``meta`` not started after ``prev`` ended where the trace has
    both times (``meta.started``, ``meta.ended``: a recording of this project's handler),
    and either issued at the same step of the run (``meta.step``: a LangGraph superstep's
    fan-out, a ToT frontier's proposals) or asking the same prompt (the samples of one
    request). A group without a step whose prompts differ (Reflexion's attempts at one
    question) stays sequential. The prompts are compared only when the rest leaves it
    open."""
    if (prev.workload, prev.run_id) != (meta.workload, meta.run_id) or meta.parent_group is None:
        return False
    if prev.parent_group != meta.parent_group:
        return False
    if prev.ended is not None and meta.started is not None and meta.started >= prev.ended:
        return False  # it waited for that one (a later round, a re-run after an interrupt)
    if meta.step is not None and prev.step is not None:
        return meta.step == prev.step
    return bool(np.array_equal(prev_prompt, prompt))


def build_calls(
    traces: Sequence[TokenizedTrace],
    tags: str = "trace",
    max_calls: int | None = None,
    max_calls_per_run: int | None = None,
    max_runs: int | None = None,
    *,
    serial_runs: bool = False,
    sources: Sequence[str] | None = None,
) -> dict[str, list[ReplayCall]]:
    """Group the calls of tokenized traces by workload, in file order; ``max_calls``,
    ``max_calls_per_run`` and ``max_runs`` (the first runs of each workload to appear)
    keep a subset. A call kept right after the call before it in its run is marked
    ``with_previous`` where :func:`issued_together` says so, unless ``serial_runs``.

    A run is its workload's calls with one run id, across files too (a trace split over
    files stays one run): a run id kept from more than one file gets a ``UserWarning``
    naming the files, since two recordings that count their runs from 0 would otherwise
    be merged silently. A call (workload, run id, ``call_index``) in more than one file is
    refused, as the loader refuses one twice in a file: the same recording given twice (a
    file passed twice, or a copy of it) would replay every call twice. ``sources`` names
    the files in messages (default: each trace's ``source``, the path its content was
    first tokenized from, which a copy shares).

    Raises:
        ValueError: a call in more than one of ``traces``.
    """
    names = list(sources) if sources is not None else [tr.source for tr in traces]
    if len(names) != len(traces):
        raise ValueError(f"{len(names)} sources given for {len(traces)} traces")
    by_wl: dict[str, list[ReplayCall]] = {}
    # (workload, run) -> its last call kept / its calls kept: run ids are a workload's own
    last: dict[tuple[str, str], tuple[CallMeta, np.ndarray]] = {}
    per_run: dict[tuple[str, str], int] = {}
    runs_of: dict[str, set[str]] = {}
    file_of: dict[tuple[str, str], int] = {}  # (workload, run) -> the first file it is in
    shared: dict[tuple[str, str], tuple[int, int]] = {}  # ... and a later one
    call_file: dict[tuple[str, str, int], int] = {}  # each call -> the file it is in
    for t_idx, tr in enumerate(traces):
        for i, meta in enumerate(tr.calls):
            first = call_file.setdefault((meta.workload, meta.run_id, meta.call_index), t_idx)
            if first != t_idx:  # checked before the subsets: the traces hold it twice
                raise ValueError(
                    f"run {meta.run_id!r:.80} of workload {meta.workload!r:.80} has "
                    f"call_index {meta.call_index} in {names[first]!r:.200} and in "
                    f"{names[t_idx]!r:.200}: the same calls given twice (a trace file passed "
                    "twice, or a copy of it?) would be replayed twice; pass each recording "
                    "once, or give different runs different run ids"
                )
            lst = by_wl.setdefault(meta.workload, [])
            if max_calls is not None and len(lst) >= max_calls:
                continue
            if max_runs is not None:
                runs = runs_of.setdefault(meta.workload, set())
                if meta.run_id not in runs:
                    if len(runs) >= max_runs:
                        continue
                    runs.add(meta.run_id)
            run_key = (meta.workload, meta.run_id)
            if max_calls_per_run is not None:
                seen = per_run.get(run_key, 0)
                if seen >= max_calls_per_run:
                    continue
                per_run[run_key] = seen + 1
            first = file_of.setdefault(run_key, t_idx)
            if first != t_idx:
                shared.setdefault(run_key, (first, t_idx))
            prompt = tr.prompt(i)
            prev = last.get(run_key)
            together = (
                not serial_runs
                and prev is not None
                and issued_together(prev[0], meta, prev[1], prompt)
            )
            last[run_key] = (meta, prompt)
            lst.append(
                ReplayCall(
                    req_id=f"{t_idx}:{meta.run_id}#{meta.call_index}#{i}",
                    run_id=meta.run_id,
                    prompt=prompt,
                    output=tr.output(i),
                    tags=_tags_for(meta, tags),
                    with_previous=together,
                )
            )
    if shared:
        (wl, run), (a, b) = next(iter(shared.items()))
        warnings.warn(
            f"{len(shared)} run id(s) are in more than one trace file, each replayed as one "
            f"run with its calls in file order (e.g. run {run!r:.60} of {wl!r:.60} in "
            f"{names[a]!r:.80} and {names[b]!r:.80}); give different runs "
            "different run ids",
            UserWarning,
            stacklevel=2,
        )
    return by_wl


def result_row(
    proposer: str, workload: str, batch: int, k: int, r: WorkloadRun, base: float
) -> ResultRow:
    """One table/JSON row: ``r``'s counters and serving metrics, speedup = ``base`` / its time."""
    proposed = r.proposed_us  # steps without a propose would pull the percentiles to 0
    us = np.asarray(proposed) if proposed else np.zeros(1)
    ttft = np.asarray(r.ttft_s) if r.ttft_s else np.zeros(1)
    tpot = np.asarray(r.tpot_s) if r.tpot_s else np.zeros(1)
    eff = r.effective_batch
    return ResultRow(
        proposer=proposer,
        workload=workload,
        batch=batch,
        k=k,
        calls=r.calls,
        output_tokens=r.output_tokens,
        steps=r.steps,
        mat=round(r.mat, 6),
        rejection_rate=round(r.rejection_rate, 6),
        drafted_per_step=round(r.drafted_per_step, 6),
        propose_us_p50=round(float(np.percentile(us, 50)), 3),
        propose_us_p99=round(float(np.percentile(us, 99)), 3),
        speedup=round(base / r.sim_time_s, 6) if r.sim_time_s > 0 else math.nan,
        max_in_flight=max(r.step_batch, default=0),
        effective_batch=round(eff, 4),
        batch_filled=eff >= FILLED * batch,
        throughput_tok_s=round(r.throughput, 4),
        ttft_p50_s=round(float(np.percentile(ttft, 50)), 6),
        ttft_p99_s=round(float(np.percentile(ttft, 99)), 6),
        tpot_p50_s=round(float(np.percentile(tpot, 50)), 6),
        tpot_p99_s=round(float(np.percentile(tpot, 99)), 6),
        prefill_tokens=r.prefill_tokens,
        prefix_hit_rate=round(r.prefix_hit_rate, 6),
        preemptions=r.preemptions,
        kv_waits=r.kv_waits,
        sim_time_s=round(r.sim_time_s, 6),
        propose_steps=r.propose_steps,
    )


def merge_runs(runs: Sequence[WorkloadRun]) -> WorkloadRun:
    """Sum several workloads' runs into one (the ``all`` row): counters add, samples concatenate."""
    out = WorkloadRun()
    for r in runs:
        out.calls += r.calls
        out.output_tokens += r.output_tokens
        out.steps += r.steps
        out.drafted += r.drafted
        out.accepted += r.accepted
        out.engine_steps += r.engine_steps
        out.sim_time_s += r.sim_time_s
        out.proposer_time_s += r.proposer_time_s
        out.propose_us.extend(r.propose_us)
        out.step_proposed.extend(r.step_proposed)
        out.step_batch.extend(r.step_batch)
        out.step_decoding.extend(r.step_decoding)
        out.ttft_s.extend(r.ttft_s)
        out.tpot_s.extend(r.tpot_s)
        out.prompt_tokens += r.prompt_tokens
        out.cached_tokens += r.cached_tokens
        out.prefill_tokens += r.prefill_tokens
        out.preemptions += r.preemptions
        out.kv_waits += r.kv_waits
    return out


def fewer_in_flight(rows: Sequence[ResultRow]) -> list[str]:
    """One line per workload whose largest batch never had that many calls in flight."""
    top: dict[str, ResultRow] = {}
    for r in rows:
        if r.workload != ALL and (r.workload not in top or r.batch > top[r.workload].batch):
            top[r.workload] = r
    return [
        f"note: {w}: at batch {r.batch} at most {r.max_in_flight} calls were in flight "
        f"({_why_fewer(r)}): that row is a replay at the smaller batch"
        for w, r in top.items()
        if 0 < r.max_in_flight < r.batch
    ]


def _why_fewer(row: ResultRow) -> str:
    """Why ``row`` had fewer calls in flight than its batch: the KV cache held calls back
    (calls waited for room, or were preempted), else the workload has fewer runs."""
    if row.kv_waits or row.preemptions:
        return (
            f"the KV cache held fewer: {row.kv_waits} waits for room, {row.preemptions} preemptions"
        )
    return "the workload has fewer runs"


def more_in_flight(rows: Sequence[ResultRow]) -> list[str]:
    """One line per workload whose runs sent calls together (fan-out siblings, the samples
    of one request: ``ReplayCall.with_previous``), so that more calls than runs were in
    flight: its rows ran at their effective batch, above their batch."""
    over: dict[str, list[ResultRow]] = {}
    for r in rows:
        if r.workload != ALL and r.max_in_flight > r.batch:
            over.setdefault(r.workload, []).append(r)
    return [
        f"note: {w}: its runs send calls together (fan-out, samples of one request), so more "
        "calls than runs were in flight: "
        + ", ".join(f"batch {r.batch} ran at {r.effective_batch:.0f}" for r in rs)
        + " (effective batch; --serial-runs sends them one at a time)"
        for w, rs in over.items()
    ]


def serving_limits(config: ReplayConfig) -> ServingLimits:
    """The preset's serving limits with the config's overrides."""
    update = {
        key: getattr(config, key)
        for key in ("max_num_batched_tokens", "kv_capacity_tokens")
        if getattr(config, key) is not None
    }
    return get_cost_model(config.cost_model).limits.model_copy(update=update)


def check_proposers(config: ReplayConfig, env: ProposerEnv | None = None) -> None:
    """Build each of ``config``'s proposers once with its options, so that a bad name or
    option fails before the slow work (tokenizing, the baseline replay).

    Raises:
        ProposerLoadError: a proposer that cannot be resolved or built with its options.
    """
    for name in dict.fromkeys(config.proposers):
        make_proposer(name, env, **config.proposer_options.get(name, {}))


def check_workloads(workloads: dict[str, list[ReplayCall]]) -> None:
    """Refuse a workload without output tokens (every call's recorded output empty):
    there is nothing to decode, so nothing to draft, time or compare (its speedup would
    be 0 / 0).

    Raises:
        ValueError: such a workload (named, with its call count).
    """
    empty = [(w, len(cs)) for w, cs in workloads.items() if not any(len(c.output) for c in cs)]
    if empty:
        named = ", ".join(f"{w!r:.80} ({n} call(s))" for w, n in empty[:5])
        more = f" and {len(empty) - 5} more" if len(empty) > 5 else ""
        raise ValueError(
            f"workload(s) {named}{more} have no output tokens to replay (every call's "
            "recorded output is empty): nothing to decode, draft or compare; leave their "
            "records out of the traces"
        )


def run_replay(
    config: ReplayConfig,
    workloads: dict[str, list[ReplayCall]],
    env: ProposerEnv | None = None,
    *,
    progress: bool = True,
) -> list[ResultRow]:
    """Replay every combination; speedups are ratios to ``none`` at the same batch size.
    The proposers and workloads are checked first (:func:`check_proposers`,
    :func:`check_workloads`).

    Raises:
        ValueError: a workload without output tokens.
        ProposerLoadError: a proposer that cannot be built with its options.
    """
    check_workloads(workloads)
    cost = get_cost_model(config.cost_model)
    limits = serving_limits(config)
    env = env or ProposerEnv(cost_model=cost, max_k=max(config.k))
    check_proposers(config, env)
    names = list(dict.fromkeys(config.proposers))
    spec_names = [p for p in names if p != "none"]
    wl_tokens = {w: int(sum(len(c.output) for c in cs)) for w, cs in workloads.items()}
    total = sum(wl_tokens.values()) * len(config.batch) * (1 + len(spec_names) * len(config.k))
    rows: list[ResultRow] = []
    with tqdm(total=total, desc="replay", unit=" tok", disable=not progress) as bar:
        for batch in config.batch:
            base: dict[str, WorkloadRun] = {}
            for wl, calls in workloads.items():
                bar.set_postfix_str(f"none {wl} b={batch}")
                base[wl] = replay_workload(
                    calls,
                    make_proposer("none", env),
                    batch=batch,
                    k=0,
                    cost_model=cost,
                    limits=limits,
                    on_tokens=bar.update,
                )
            base_all = merge_runs(list(base.values()))
            if "none" in names:
                for k in config.k:
                    for wl, r in base.items():
                        rows.append(result_row("none", wl, batch, k, r, r.sim_time_s))
                    rows.append(result_row("none", ALL, batch, k, base_all, base_all.sim_time_s))
            for name in spec_names:
                for k in config.k:
                    runs = {}
                    for wl, calls in workloads.items():
                        bar.set_postfix_str(f"{name} {wl} b={batch} k={k}")
                        prop = make_proposer(name, env, **config.proposer_options.get(name, {}))
                        runs[wl] = replay_workload(
                            calls,
                            prop,
                            batch=batch,
                            k=k,
                            cost_model=cost,
                            limits=limits,
                            add_proposer_time=config.add_proposer_time,
                            on_tokens=bar.update,
                        )
                        rows.append(result_row(name, wl, batch, k, runs[wl], base[wl].sim_time_s))
                    merged = merge_runs(list(runs.values()))
                    rows.append(result_row(name, ALL, batch, k, merged, base_all.sim_time_s))
    order = {n: i for i, n in enumerate(names)}
    wl_order = {w: i for i, w in enumerate([*workloads, ALL])}
    rows.sort(key=lambda r: (order[r.proposer], r.k, wl_order[r.workload], r.batch))
    return rows


def load_summary(stats: dict[str, LoadStats]) -> dict[str, Any]:
    """Per-file load counts for the report."""
    return {
        str(Path(p)): {"records": s.records, "skipped": s.skipped, "errors": s.errors[:5]}
        for p, s in stats.items()
    }
