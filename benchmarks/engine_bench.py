"""Engine benchmark: agent-style requests through the embedded vLLM engine, per drafter.

Prompts come from real agent traces (the trace files are an argument; nothing here needs
them at import). Each selected call's prompt is rendered with the model's chat template,
cut to its last ``--prompt-tokens`` tokens, and sent with its structure tags (agent, run as
query, segment hint, parent group) in ``SamplingParams.extra_args``. For each drafter —
no speculation, vLLM's ``ngram``, vLLM's ``suffix`` (SuffixDecoding via arctic-inference),
AgentSpec through our adapter — an engine serves the requests in waves of ``B``
concurrent requests for each batch size ``B`` (a fresh engine per drafter and ``B``, so
no cache carries over from an earlier pass over the same requests), greedy. Printed per
(drafter, B): output tokens/s, acceptance (accepted / drafted tokens, from vLLM's
spec-decode counters), wall time, and both as ratios to no speculation; whether every
output is token-for-token identical to no speculation's; for drafters run through our
adapter, its time per draft call (``ms/step``, proposer + bookkeeping) and any faults.

CPU numbers on a small model: they check the integration and compare drafters on equal
terms here; they say nothing about GPU speedups.

    python benchmarks/engine_bench.py --traces ../shared/traces/*.jsonl.xz \
        --requests 24 --batch 1,4,16 --max-tokens 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentspec_mw.tags import StructureTags, tags_to_wire
from agentspec_mw.traces.loader import iter_records
from agentspec_mw.traces.render import render_prompt_text

SEGMENTS = {"plan", "tool_call", "observation", "answer", "other"}


def load_requests(
    paths: list[str], per_file: int, tokenizer: Any, prompt_tokens: int
) -> list[tuple[str, dict[str, Any]]]:
    """``per_file`` calls from each trace (consecutive calls of a few runs), as (prompt, tags)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        taken = 0
        for rec in iter_records(path, skip_malformed=True):
            if taken >= per_file:
                break
            text = render_prompt_text(rec.prompt, tokenizer)
            ids = tokenizer(text, add_special_tokens=False).input_ids[-prompt_tokens:]
            segment = rec.segment_hint if rec.segment_hint in SEGMENTS else "other"
            tags = StructureTags(
                agent_id=rec.agent[:200],
                query_id=rec.run_id[:200],
                segment=segment,  # type: ignore[arg-type]
                group_id=rec.parent_group[:200] if rec.parent_group else None,
                group_kind="retry" if rec.parent_group else None,
            )
            out.append((tokenizer.decode(ids), tags_to_wire(tags)))
            taken += 1
    return out


def run_once(
    speculative: str | None,
    requests: list[tuple[str, dict[str, Any]]],
    b: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Serve every request in waves of ``b`` on a fresh engine (no cache carried over)."""
    from vllm import SamplingParams

    from agentspec_mw_vllm.engine import build_llm, engine_counters, shutdown
    from agentspec_mw_vllm.metrics import get_metrics

    llm = build_llm(
        args.model,
        speculative=speculative,
        k=args.k,
        max_model_len=args.prompt_tokens + args.max_tokens + 2 * args.k + 8,
        enforce_eager=not args.compile,
        disable_log_stats=False,
        max_num_seqs=b,
        kv_cache_memory_bytes=args.kv_cache_mib << 20,
        dtype=args.dtype,
    )
    try:
        # Warm-up (not timed, not a trace prompt): first-call costs out of the measurement.
        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)
        d0, a0, _ = engine_counters(llm)
        m0 = get_metrics().snapshot()
        outputs: list[list[int]] = []
        t0 = time.perf_counter()
        for i in range(0, len(requests), b):
            wave = requests[i : i + b]
            params = [
                SamplingParams(temperature=0.0, max_tokens=args.max_tokens, extra_args=x)
                for _, x in wave
            ]
            outs = llm.generate([p for p, _ in wave], params, use_tqdm=False)
            outputs += [list(o.outputs[0].token_ids) for o in outs]
        wall = time.perf_counter() - t0
        d1, a1, _ = engine_counters(llm)
        m1 = get_metrics().snapshot()
    finally:
        shutdown(llm)
    tokens = sum(map(len, outputs))
    name = speculative or "none"
    print(f"  {name} B={b}: {wall:.1f} s, {tokens / wall:.1f} tok/s", flush=True)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "drafted": d1 - d0,
        "accepted": a1 - a0,
        "acceptance": (a1 - a0) / (d1 - d0) if d1 > d0 else None,
        "adapter_ms_per_step": (
            1e3 * (m1.proposer_seconds - m0.proposer_seconds) / (m1.draft_steps - m0.draft_steps)
            if m1.draft_steps > m0.draft_steps
            else None
        ),
        "faults": {k: v - m0.faults.get(k, 0) for k, v in m1.faults.items()},
        "outputs": outputs,
    }


def _ms(value: float | None) -> str:
    return f"{'-':>8}" if value is None else f"{value:>8.3f}"


def format_table(table: dict[str, dict[int, dict[str, Any]]], batches: list[int]) -> str:
    """Rows per (drafter, B): tok/s, acceptance, wall time, ratios to no speculation."""
    head = (
        f"{'drafter':<10} {'B':>3} {'tok/s':>7} {'x none':>7} {'accept':>7} "
        f"{'wall s':>7} {'wall/none':>9} {'identical':>9} {'ms/step':>8}"
    )
    lines = [head, "-" * len(head)]
    base = table["none"]
    for name, per_b in table.items():
        for b in batches:
            r = per_b[b]
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.1%}"
            same = r["outputs"] == base[b]["outputs"]
            lines.append(
                f"{name:<10} {b:>3} {r['tokens_per_s']:>7.1f} "
                f"{r['tokens_per_s'] / base[b]['tokens_per_s']:>6.2f}x {acc:>7} "
                f"{r['wall_s']:>7.1f} {r['wall_s'] / base[b]['wall_s']:>9.2f} "
                f"{'yes' if same else 'NO':>9} "
                + (
                    "       -"
                    if r["adapter_ms_per_step"] is None
                    else f"{r['adapter_ms_per_step']:>8.3f}"
                )
            )
            if any(r["faults"].values()):
                lines.append(f"{'':<10} proposer faults: {r['faults']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", nargs="+", required=True, help="trace files (.jsonl[.xz])")
    p.add_argument("--model", default=None, help="HF id or folder (default: SmolLM2-135M)")
    p.add_argument("--drafters", default="none,ngram,suffix,agentspec")
    p.add_argument("--batch", default="1,4,16", help="concurrent requests per wave")
    p.add_argument("--requests", type=int, default=24, help="requests in all (split per file)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=512, help="keep the prompt's tail")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--kv-cache-mib", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float32")
    p.add_argument("--compile", action="store_true", help="torch.compile (slow start on CPU)")
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)

    from agentspec_mw_vllm.engine import apply_env_defaults

    apply_env_defaults(in_process=True)
    from transformers import AutoTokenizer

    from agentspec_mw.default_model import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    per_file = max(1, args.requests // len(args.traces))
    requests = load_requests(args.traces, per_file, tokenizer, args.prompt_tokens)
    batches = [int(b) for b in args.batch.split(",")]
    drafters = args.drafters.split(",")
    if drafters[0] != "none":
        drafters = ["none", *[d for d in drafters if d != "none"]]
    print(f"{len(requests)} requests from {len(args.traces)} trace files", flush=True)
    table: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for b in batches:
        for name in drafters:
            table[name][b] = run_once(None if name == "none" else name, requests, b, args)
    print(format_table(table, batches))
    identical = all(
        table[n][b]["outputs"] == table["none"][b]["outputs"] for n in table for b in batches
    )
    print(f"outputs identical to no speculation: {'yes' if identical else 'NO'}")
    for name, per_b in table.items():
        for b, r in per_b.items():
            for i, (got, want) in enumerate(
                zip(r["outputs"], table["none"][b]["outputs"], strict=True)
            ):
                if got != want:
                    pos = next(
                        (j for j, (x, y) in enumerate(zip(got, want, strict=False)) if x != y),
                        min(len(got), len(want)),
                    )
                    print(f"  differs: {name} B={b} request {i} from output token {pos}")
    if args.json_out:
        slim = {
            n: {b: {k: v for k, v in r.items() if k != "outputs"} for b, r in per_b.items()}
            for n, per_b in table.items()
        }
        Path(args.json_out).write_text(
            json.dumps({"args": vars(args), "results": slim, "identical": identical}, indent=1)
        )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
