"""Set-up shared by the benchmark scripts: tokenized traces, replay calls, proposer env;
for the scripts that replay one trace with AgentSpec and look at its steps: their
options, the trace and an :class:`Observed` base that passes the replay's calls on; and
for the scripts that sweep a setting (one ``agentspec replay`` per value): the replay
run, the ``--`` split of pass-through options, their parser and figure writing.

The scripts run as ``python benchmarks/<script>.py``, so this folder is on ``sys.path``
and they import this module by its bare name. It puts this checkout's root first on
``sys.path``, so a script run from a git worktree measures that worktree's code (an
editable install of the package points at the main checkout).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentspec_mw.cli import main as agentspec_main
from agentspec_mw.costmodel import StepTimeFn, get_cost_model
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.replay.run import build_calls
from agentspec_mw.replay.sim import ReplayCall
from agentspec_mw.tokens import token_bytes_table
from agentspec_mw.traces.tokenized import load_tokenizer, tokenize_trace

__all__ = [
    "Observed",
    "engine_ab_parser",
    "OneTrace",
    "ReplaySetup",
    "load_trace",
    "load_workloads",
    "replay_cli",
    "replay_parser",
    "save_figure",
    "split_passthrough",
    "sweep_parser",
    "trace_parser",
]


@dataclass(frozen=True)
class ReplaySetup:
    """Replay calls by workload, with the proposer environment and cost model to use."""

    workloads: dict[str, list[ReplayCall]]
    env: ProposerEnv
    cost: StepTimeFn


def load_workloads(
    traces: Sequence[str],
    tokenizer: str,
    *,
    max_k: int,
    cost_model: str = "llama8b-h100",
    max_calls: int | None = None,
    max_calls_per_run: int | None = None,
    tags: str = "trace",
    serial_runs: bool = False,
) -> ReplaySetup:
    """Tokenize ``traces`` (cached) and build their calls as ``agentspec replay`` does
    (``tags``: ``trace`` or ``none``, its ``--tags``; ``serial_runs``, its
    ``--serial-runs``: a timing per step of ``batch`` requests wants it, since calls issued
    together put more requests than runs in flight)."""
    tok = load_tokenizer(tokenizer)
    cost = get_cost_model(cost_model)
    env = ProposerEnv(token_bytes=token_bytes_table(tok), cost_model=cost, max_k=max(max_k, 1))
    tokenized = [tokenize_trace(p, tok) for p in traces]
    workloads = build_calls(
        tokenized,
        tags,
        max_calls=max_calls,
        max_calls_per_run=max_calls_per_run,
        serial_runs=serial_runs,
    )
    return ReplaySetup(workloads, env, cost)


def engine_ab_parser(doc: str | None, *, batch: str) -> argparse.ArgumentParser:
    """A parser for the A/B scripts on the engine recordings (``benchmarks/traces/``):
    ``--tokenizer`` (``default``: the embedded model's), ``--cost-model`` (``cpu-smollm2``),
    ``--batch`` (comma list, default ``batch``) and ``--k`` (8, the engine's default); each
    script adds its ``--traces`` and what it compares."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--tokenizer", default="default")
    ap.add_argument("--cost-model", default="cpu-smollm2")
    ap.add_argument("--batch", default=batch, help="comma list")
    ap.add_argument("--k", type=int, default=8)
    return ap


def trace_parser(doc: str | None, *, batch: str) -> argparse.ArgumentParser:
    """A parser for the scripts that replay one trace with AgentSpec and look at its steps:
    ``--trace``, ``--tokenizer``, ``--batch`` (comma list, default ``batch``), ``--k``
    (16), ``--cost-model`` (``llama8b-h100``) and ``--max-calls-per-run``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", default=batch, help="comma list")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cost-model", default="llama8b-h100")
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    return ap


@dataclass(frozen=True)
class OneTrace:
    """One trace's calls (its single workload), their recorded outputs by request id, the
    batch sizes asked for, and the proposer environment and cost model."""

    workload: str
    calls: list[ReplayCall]
    outputs: dict[str, Any]
    batches: list[int]
    setup: ReplaySetup


def load_trace(args: argparse.Namespace) -> OneTrace:
    """What :func:`trace_parser`'s options name."""
    setup = load_workloads(
        [args.trace],
        args.tokenizer,
        max_k=args.k,
        cost_model=args.cost_model,
        max_calls_per_run=args.max_calls_per_run,
    )
    ((workload, calls),) = setup.workloads.items()
    outputs = {c.req_id: c.output for c in calls}
    return OneTrace(workload, calls, outputs, [int(x) for x in args.batch.split(",")], setup)


class Observed:
    """AgentSpec driving a replay under a benchmark's eye: the replay's calls go to ``a``
    (its candidate record turned on) and to each of ``shadows`` (proposers that draft
    beside it, never verified), and ``pos`` keeps each request's position in its recorded
    output. Subclasses define ``propose``."""

    name = "agentspec"

    def __init__(self, a: Any, *shadows: Any) -> None:
        self.a = a
        self.a.candidates = {}
        self.shadows = shadows
        self.pos: dict[str, int] = {}

    def start(self, req_id: str, prompt: Any, tags: Any = None) -> None:
        self.a.start(req_id, prompt, tags)
        for s in self.shadows:
            s.start(req_id, prompt, tags)
        self.pos[req_id] = 0

    def extend(self, req_id: str, ids: Any) -> None:
        self.a.extend(req_id, ids)
        for s in self.shadows:
            s.extend(req_id, ids)
        self.pos[req_id] += len(ids)

    def stop(self, req_id: str) -> None:
        self.a.stop(req_id)
        for s in self.shadows:
            s.stop(req_id)


def replay_parser(doc: str | None, *, proposers: str) -> argparse.ArgumentParser:
    """A parser with the options every multi-trace script takes: ``--traces``,
    ``--tokenizer``, ``--proposers`` (default ``proposers``) and ``--batch`` (256)."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--proposers", default=proposers)
    ap.add_argument("--batch", type=int, default=256)
    return ap


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(own options, options after "--")``: the latter go to every ``agentspec replay``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def replay_cli(args: Sequence[str], json_path: Path) -> Path:
    """Run ``agentspec replay ARGS --json json_path`` in this process and return the report
    path; the per-run plot is dropped (the scripts draw one combined plot)."""
    argv = ["replay", *args, "--json", str(json_path), "--plot", str(json_path.with_suffix(".png"))]
    if agentspec_main(argv) != 0:
        raise SystemExit(f"agentspec replay failed: {' '.join(argv)}")
    json_path.with_suffix(".png").unlink(missing_ok=True)
    return json_path


def save_figure(fig: Any, path: Path) -> None:
    """Write a matplotlib figure as a PNG and say where."""
    fig.savefig(path, dpi=110)
    print(f"\nwrote {path}", file=sys.stderr)


def sweep_parser(description: str, *, batch: str, out_dir: str) -> argparse.ArgumentParser:
    """A parser for the scripts that run ``agentspec replay`` once per setting:
    ``--traces``, ``--tokenizer``, ``--batch`` (comma list), ``--k`` and ``--out-dir``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", default=batch)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--out-dir", default=out_dir)
    return ap
