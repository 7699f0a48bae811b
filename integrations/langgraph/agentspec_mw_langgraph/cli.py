"""``agentspec demo`` (added to the ``agentspec`` command by :func:`add_commands`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add the ``demo`` subcommand to the ``agentspec`` parser's subparsers."""
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
