"""The ``agentspec`` command line: ``replay`` (and the integrations' subcommands)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentspec_mw.errors import AgentSpecError, validation_message

__all__ = ["check_writable", "main", "os_error_message", "validation_message"]

# Subcommands contributed by the integrations: (module, function adding the parser).
_PLUGIN_COMMANDS: list[tuple[str, str]] = [
    ("agentspec_mw_vllm.cli", "add_commands"),
    ("agentspec_mw_langgraph.cli", "add_commands"),
]


def os_error_message(exc: OSError) -> str:
    """An ``OSError`` as one line naming its path (``str(exc)`` where it has none)."""
    if exc.filename is None:
        return str(exc)

    def name(raw: object) -> str:
        return repr(os.fsdecode(raw) if isinstance(raw, str | bytes) else str(raw))

    path = name(exc.filename)
    if exc.filename2 is not None:
        path += f" -> {name(exc.filename2)}"
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, FileExistsError | NotADirectoryError):
        reason += " (a file is in the way where that path needs a folder)"
    return f"{path}: {reason}"


def check_writable(paths: Sequence[str | Path]) -> None:
    """Create each path's folder and check the path can be written (opened for append; a
    file this creates is removed again), so that a bad output path fails before the slow
    work (a replay, a bench sweep) rather than after it.

    Raises:
        ValueError: a path (named) that cannot be written.
    """
    for path in map(Path, paths):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            hint = (
                f": is a part of {str(path.parent)!r} a file?"
                if isinstance(exc, FileExistsError | NotADirectoryError)
                else ""
            )
            raise ValueError(
                f"cannot write {str(path)!r}: its folder cannot be made "
                f"({exc.strerror or exc}{hint})"
            ) from None
        try:
            existed = path.exists()
            with path.open("a"):
                pass
            if not existed:
                path.unlink()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ValueError(f"cannot write {str(path)!r}: {reason}") from None


def _csv(cast: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        try:
            return [cast(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None

    return parse


def _parse_set(items: Sequence[str], proposers: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """``--set PROPOSER.OPTION=VALUE`` items by proposer; a proposer given as a dotted
    path (``pkg.mod.Class``) is matched by the longest of ``proposers`` the key starts with."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        named = [p for p in proposers if "." in p and key.startswith(p + ".")]
        if named:
            prop = max(named, key=len)
            dot, opt = ".", key[len(prop) + 1 :]
        else:
            prop, dot, opt = key.partition(".")
        if not sep or not dot or not prop or not opt:
            raise argparse.ArgumentTypeError(
                f"--set {item!r}: expected PROPOSER.OPTION=VALUE, e.g. suffix.min_token_prob=0.1"
            )
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(prop, {})[opt] = value
    return out


def _routings(text: str) -> list[str]:
    from agentspec_mw.replay.replicas import parse_routings

    try:
        return list(parse_routings(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_replay(sub: Any) -> None:
    from agentspec_mw.costmodel import PRESETS  # numpy and pydantic only

    p = sub.add_parser(
        "replay",
        help="replay agent traces through proposers and predict speedups",
        description=(
            "Greedy-oracle replay: each call's recorded output is what the model emits; "
            "proposers draft, drafts are verified against it, and each engine step is "
            "scheduled as vLLM's V1 scheduler does (token budget, chunked prefill, prefix "
            "cache, KV capacity of the cost model's hardware) and timed by its step-time "
            "model: speedups over no speculation, effective batch, throughput, TTFT and "
            "TPOT at each batch size (runs in flight)."
        ),
    )
    p.add_argument("--traces", nargs="+", required=True, help="trace files (.jsonl[.xz|.gz])")
    p.add_argument(
        "--tokenizer",
        required=True,
        help="Hugging Face tokenizer name or folder, or `default`: the embedded default model's",
    )
    p.add_argument("--proposers", type=_csv(str), default=["none", "ngram", "suffix"])
    p.add_argument("--batch", type=_csv(int), default=[1, 64, 256])
    p.add_argument("--k", type=_csv(int), default=[8])
    p.add_argument(
        "--cost-model",
        default="llama8b-h100",
        help=f"step-time preset with its hardware limits ({', '.join(PRESETS)})",
    )
    p.add_argument(
        "--add-proposer-time",
        action="store_true",
        help="add each step's measured proposer time to the simulated step",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (default: the preset's)",
    )
    p.add_argument(
        "--kv-capacity",
        type=int,
        default=None,
        help="KV-cache capacity in tokens (default: the preset's)",
    )
    p.add_argument("--tags", choices=["trace", "none"], default="trace")
    p.add_argument("--set", action="append", default=[], metavar="PROPOSER.OPTION=VALUE")
    p.add_argument("--max-calls", type=int, default=None, help="first N calls per workload")
    p.add_argument("--max-calls-per-run", type=int, default=None, help="first N calls per run")
    p.add_argument("--max-runs", type=int, default=None, help="first N runs per workload")
    p.add_argument("--skip-malformed", action="store_true", help="count and skip bad records")
    p.add_argument(
        "--serial-runs",
        action="store_true",
        help="replay each run's calls one after another, also those the trace marks as "
        "issued together (fan-out siblings, the samples of one request; before 2026-12-05 "
        "the only way)",
    )
    p.add_argument(
        "--run-order",
        default="file",
        metavar="file|reversed|shuffle:SEED",
        help="the order a workload's runs are admitted in (default: as in the file)",
    )
    p.add_argument(
        "--replicas",
        type=_csv(int),
        default=None,
        help="what-if: R replicas, each with its own proposer and share of the batch "
        "(agentspec_mw.replay.replicas), e.g. 2,4,8",
    )
    p.add_argument(
        "--routing",
        type=_routings,
        default=["affinity", "round-robin"],
        help="with --replicas: affinity (a run's calls on one replica), round-robin",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write the JSON report here")
    p.add_argument(
        "--plot",
        default=None,
        help="plot path (default: next to --json, or replay.png); .png is added to a name "
        "without an image extension",
    )
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument("--cache-dir", default=None, help="token cache (default ~/.cache/agentspec_mw)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_cmd_replay)


def _cmd_replay(args: argparse.Namespace) -> int:
    from agentspec_mw.costmodel import get_cost_model
    from agentspec_mw.proposer import ProposerEnv
    from agentspec_mw.registry import resolve_proposer_class
    from agentspec_mw.replay.report import format_table, plot_speedup
    from agentspec_mw.replay.run import (
        ReplayConfig,
        ReplayReport,
        build_calls,
        check_proposers,
        fewer_in_flight,
        load_summary,
        more_in_flight,
        order_runs,
        run_replay,
        serving_limits,
    )
    from agentspec_mw.tokens import token_bytes_table
    from agentspec_mw.traces.loader import LoadStats
    from agentspec_mw.traces.tokenized import load_tokenizer, tokenize_trace

    config = ReplayConfig(
        traces=list(args.traces),
        tokenizer=args.tokenizer,
        proposers=args.proposers,
        batch=args.batch,
        k=args.k,
        cost_model=args.cost_model,
        add_proposer_time=args.add_proposer_time,
        tags=args.tags,
        proposer_options=_parse_set(args.set, args.proposers),
        max_calls=args.max_calls,
        max_calls_per_run=args.max_calls_per_run,
        max_runs=args.max_runs,
        skip_malformed=args.skip_malformed,
        run_order=args.run_order,
        serial_runs=args.serial_runs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_capacity_tokens=args.kv_capacity,
    )
    for name in config.proposers:  # fail before any slow work
        resolve_proposer_class(name)
    if args.replicas and any(r < 1 for r in args.replicas):
        raise ValueError(f"--replicas {args.replicas}: each must be >= 1")
    if args.replicas:  # before tokenizing (run_replica_replay checks it again)
        from agentspec_mw.replay.replicas import check_replica_batches

        check_replica_batches(config.batch, args.replicas)
    if args.replicas and all(name == "none" for name in config.proposers):
        raise ValueError(
            "--replicas compares each proposer's speedup over none on the same replicas: "
            "give a proposer besides none (e.g. --proposers none,agentspec)"
        )
    json_out, plot = _output_paths(args)  # a bad path fails before the replay, not after
    progress = not args.no_progress
    tokenizer = load_tokenizer(config.tokenizer)
    env = ProposerEnv(
        token_bytes=token_bytes_table(tokenizer),
        cost_model=get_cost_model(config.cost_model),
        max_k=max(config.k),
    )
    check_proposers(config, env)  # bad options fail before tokenizing
    cache = Path(args.cache_dir) if args.cache_dir else None
    stats = {p: LoadStats() for p in config.traces}
    traces = [
        tokenize_trace(
            p,
            tokenizer,
            cache_dir=cache,
            skip_malformed=config.skip_malformed,
            stats=stats[p],
            progress=progress,
        )
        for p in config.traces
    ]
    for p, s in stats.items():
        if s.skipped:
            print(f"warning: {p}: skipped {s.skipped} malformed records", file=sys.stderr)
    workloads = build_calls(
        traces,
        config.tags,
        config.max_calls,
        config.max_calls_per_run,
        config.max_runs,
        serial_runs=config.serial_runs,
        sources=config.traces,
    )
    workloads = {wl: order_runs(calls, config.run_order) for wl, calls in workloads.items()}
    if not any(workloads.values()):
        skipped = sum(s.skipped for s in stats.values())
        why = f" ({skipped} malformed record(s) skipped)" if skipped else ""
        raise ValueError(
            f"no calls to replay in {', '.join(config.traces)}: the traces hold no (valid) "
            f"records{why}; pass trace files that hold records"
        )
    if args.replicas:
        return _replica_replay(args, config, workloads, env, json_out, plot)
    rows = run_replay(config, workloads, env, progress=progress)
    print(format_table(rows))
    if not all(r.batch_filled for r in rows):
        print("* effective batch under 80 % of the batch: not a replay at that batch size")
    for line in fewer_in_flight(rows) + more_in_flight(rows):
        print(line)
    limits = serving_limits(config).model_dump()
    report = ReplayReport(config=config, results=rows, load=load_summary(stats), limits=limits)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report.model_dump_json(indent=1))
        print(f"wrote {json_out}")
    title = f"cost model {config.cost_model}, k={','.join(map(str, config.k))}"
    if plot is not None:
        print(f"wrote {plot_speedup(rows, plot, title)}")
    return 0


def _output_paths(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    """``agentspec replay``'s ``--json`` path and plot path (``--plot``, else next to
    ``--json``, else ``replay.png``; :func:`~agentspec_mw.replay.report.plot_path` adds
    ``.png`` where matplotlib would; ``None`` with ``--no-plot``), both checked writable.

    Raises:
        ValueError: a path that cannot be written, a ``--plot`` that is a folder,
            ``--plot`` naming the ``--json`` file, or ``--json`` naming a trace.
    """
    from agentspec_mw.replay.report import plot_path

    json_out = Path(args.json_out) if args.json_out else None
    inputs = {Path(t).resolve() for t in args.traces}
    if json_out is not None and json_out.resolve() in inputs:
        raise ValueError(
            f"--json {str(json_out)!r} is one of the --traces: the report would overwrite "
            "the trace; give another name"
        )
    if args.no_plot:
        if args.plot:
            raise ValueError("--plot and --no-plot: give one")
        if json_out is not None:
            check_writable([json_out])
        return json_out, None
    default = json_out.with_suffix(".png") if json_out is not None else Path("replay.png")
    plot = plot_path(args.plot or default)
    if json_out is not None and plot.resolve() == json_out.resolve():
        raise ValueError(
            f"--plot {str(plot)!r} is the --json file too: the plot would overwrite the "
            "report; give them different names"
        )
    check_writable([plot] if json_out is None else [json_out, plot])
    return json_out, plot


def _replica_replay(
    args: argparse.Namespace,
    config: Any,
    workloads: Any,
    env: Any,
    json_out: Path | None,
    plot: Path | None,
) -> int:
    """``agentspec replay --replicas``: the cluster what-if (its own table, JSON and plot)."""
    from agentspec_mw.replay.replicas import (
        format_replica_table,
        plot_replicas,
        run_replica_replay,
    )

    rows = run_replica_replay(
        config, workloads, args.replicas, args.routing, env, progress=not args.no_progress
    )
    print(format_replica_table(rows))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "config": config.model_dump(mode="json"),
            "replicas": args.replicas,
            "routing": args.routing,
            "results": [r.model_dump() for r in rows],
        }
        json_out.write_text(json.dumps(report, indent=1, allow_nan=False))
        print(f"wrote {json_out}")
    title = f"replicas: cost model {config.cost_model}, batch {config.batch}, k={config.k}"
    if plot is not None:
        print(f"wrote {plot_replicas(rows, plot, title)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with the integrations' subcommands where they are installed."""
    parser = argparse.ArgumentParser(prog="agentspec", description="AgentSpec-MW tools")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_replay(sub)
    for module_name, fn in _PLUGIN_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        getattr(module, fn)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agentspec`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValidationError as exc:  # a bad option: one line per problem
        message = validation_message(exc)
    except OSError as exc:  # a path that cannot be made, read or written
        message = os_error_message(exc)
    except (
        AgentSpecError,
        ValueError,
        argparse.ArgumentTypeError,  # a malformed --set, parsed in the command
    ) as exc:
        message = str(exc)
    print(f"agentspec {args.command}: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
