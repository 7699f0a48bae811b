"""``agentspec demo`` and ``agentspec bench`` (added to the ``agentspec`` command by
:func:`add_commands`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add the ``demo`` and ``bench`` subcommands to the ``agentspec`` parser's subparsers."""
    p = sub.add_parser(
        "demo",
        help="run the multi-agent LangGraph demo without speculation, with SuffixDecoding "
        "and with AgentSpec, side by side",
        description=(
            "Runs a multi-agent LangGraph workflow (planner, Send fan-out of workers, a "
            "tool-calling agent with local tools, critic, final answer) on the embedded "
            "vLLM engine three times -- no speculation, SuffixDecoding, AgentSpec -- and "
            "prints wall time, tokens/s, accepted tokens per step, rejection rate and "
            "per-agent acceptance, whether the outputs were identical, and writes a PNG."
        ),
    )
    p.add_argument("--model", default=None, help="HF model id or folder (default: SmolLM2-135M)")
    p.add_argument(
        "--server-url",
        default=None,
        help="run once against this vLLM server (e.g. http://127.0.0.1:8000/v1) instead",
    )
    p.add_argument("--k", type=int, default=8, help="draft tokens per step (default 8)")
    p.add_argument("--max-tokens", type=int, default=48, help="per LLM call (default 48)")
    p.add_argument(
        "--topics", default="tea,coffee", help="one concurrent query per topic (default tea,coffee)"
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="engine dtype (default float32: bfloat16 verification can flip near-ties)",
    )
    p.add_argument(
        "--out", default="out/demo", help="writes OUT.png and OUT.txt (default out/demo)"
    )
    p.set_defaults(func=_cmd_demo)
    _add_bench(sub)


def _cmd_demo(args: argparse.Namespace) -> int:
    from agentspec_mw_langgraph.demo import outputs_identical, run_demo

    # three engines' start-up logs would bury the progress lines; set it to see them
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if args.k < 1:
        raise ValueError(f"--k={args.k} must be >= 1")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens={args.max_tokens} must be >= 1")
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    if not topics:
        raise ValueError("--topics is empty")
    runs = run_demo(
        model=args.model,
        server_url=args.server_url,
        k=args.k,
        max_tokens=args.max_tokens,
        topics=topics,
        out=args.out,
        progress=lambda msg: print(msg, flush=True),
        dtype=args.dtype,
    )
    return 0 if outputs_identical(runs) else 1


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers, e.g. 1,4,16") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="N concurrent multi-agent LangGraph workflows per speculation method, on the "
        "embedded engine: throughput, TPOT, latency, acceptance, identical outputs",
        description=(
            "Runs N concurrent LangGraph workflows (demo: planner, fan-out, critic, writer; "
            "tool_loop: create_agent with local tools; reflect: a review/revise loop; or "
            "your own graph by import path) on "
            "one warmed engine per method (none, ngram, suffix, agentspec, "
            "agentspec-untagged), repeats interleaved across methods; prints medians and "
            "ratios to none, writes OUT.txt, OUT.png, OUT.steps.jsonl (the measured cost "
            "model's timed steps) and --json. Exit code 1 if any "
            "output differs from none's."
        ),
    )
    p.add_argument("--n", type=_ints, default=None, help="concurrent workflows (1,4,16,32,64)")
    p.add_argument(
        "--methods",
        type=_names,
        default=None,
        help="comma list (all five); none always runs too, as the baseline",
    )
    p.add_argument(
        "--apps",
        type=_names,
        default=None,
        help="comma list of demo, tool_loop, reflect (all three) and/or your own app as an "
        "import path package.module:build or path/to/file.py:build, where build(model) "
        "returns a compiled graph (the module may define make_input(topic); see "
        "docs/langgraph.md) or the attribute is a BenchApp",
    )
    p.add_argument("--repeats", type=int, default=None, help="runs per cell (3)")
    p.add_argument(
        "--min-workflows",
        type=int,
        default=None,
        help="workflows per run at least; N at a time (8)",
    )
    p.add_argument("--k", type=int, default=None, help="draft tokens per step (8)")
    p.add_argument("--max-tokens", type=int, default=None, help="per LLM call (48)")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="of every LLM call (0: greedy); sampled outputs are not compared with none's",
    )
    p.add_argument("--max-num-seqs", type=int, default=None, help="engine batch limit (64)")
    p.add_argument("--model", default=None, help="HF model id or folder (default model)")
    p.add_argument(
        "--preload",
        choices=("on", "off", "both"),
        default=None,
        help="vLLM's CPU preload (tcmalloc, Intel OpenMP) in the engine processes; both: "
        "each method also runs without it, interleaved (default on)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="one run (or an engine's start) at most: past it the engine process is killed "
        "and the bench fails, naming the run (1800; inf: no limit)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny run for CI (N=2, demo app)")
    p.add_argument("--json", default=None, help="write the report as JSON here")
    p.add_argument(
        "--out",
        default="out/bench",
        help="writes OUT.txt, OUT.png, OUT.steps.jsonl (out/bench; OUT keeps its dots, an "
        "ending .txt/.png/.json/.steps.jsonl is dropped)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--show",
        default=None,
        metavar="REPORT",
        help="run nothing: print the table and verdicts of a stored --json report "
        "(.json, or .xz / .gz compressed) and write OUT.png",
    )
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from agentspec_mw_langgraph.bench import (
        BenchConfig,
        BenchMismatchError,
        quick_config,
        run_bench,
    )

    given = {
        "ns": args.n,
        "methods": args.methods,
        "apps": args.apps,
        "repeats": args.repeats,
        "min_workflows": args.min_workflows,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "max_num_seqs": args.max_num_seqs,
        "model": args.model,
        "preload": args.preload,
        "run_timeout_s": args.run_timeout,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if args.show is not None:
        if given or args.quick or args.json is not None:
            raise ValueError("--show runs nothing: give it alone (and --out for the plot)")
        return _show(args.show, args.out)
    config = quick_config(**given) if args.quick else BenchConfig(**given)
    try:
        run_bench(
            config,
            out=args.out,
            json_path=args.json,
            progress=not args.no_progress,
            echo=lambda msg: print(msg, flush=True),
        )
    except BenchMismatchError as exc:
        print(f"agentspec bench: {exc}", flush=True)
        return 1
    return 0


def _show(report_path: str, out: str) -> int:
    """Print a stored report's table and verdicts, write ``<out>.png``; exit code 1 if its
    outputs differed from none's, as the run's was."""
    from agentspec_mw.cli import check_writable
    from agentspec_mw_langgraph.bench import format_report, out_file, plot_report, read_report

    plot = out_file(out, ".png")
    check_writable([plot])  # before the table: a bad --out fails alone
    report = read_report(report_path)
    print(format_report(report))
    if report.sample_output:
        print("\n" + report.sample_output)
    print(f"wrote {plot_report(report, plot)}")
    return 1 if report.mismatches else 0
