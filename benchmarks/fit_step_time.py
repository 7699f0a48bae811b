"""Fit a step-time preset to the embedded engine's own steps (the ``cpu-smollm2`` preset).

Runs the embedded vLLM engine without speculation (default model unless ``--model``)
over a grid of concurrent requests × prompt lengths (random token ids, so the prefix
cache never hits), times every engine step (schedule + forward + sampling + bookkeeping,
``EngineCore.step``; wall seconds and the engine thread's CPU seconds), and records per
step the tokens it scheduled (prefill chunks + decodes), the KV tokens those requests hold
after it and the requests it scheduled (its logits rows: no drafts here). The steps are
fitted with :func:`agentspec_mw.costfit.fit_step_times` (``c_fix + c_tok N_batched +
c_kv N_kv + c_row N_rows``, non-negative, relative error), and the script prints the
constants, the engine's token budget and KV capacity, and the fit's error on decode and
prefill steps. ``--from-steps`` fits the serving steps a live run recorded instead
(``replay_validation.py live --steps-prefix``; rows = requests + drafts).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 \
        python benchmarks/fit_step_time.py --json fit.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np


def _grid(spec: str) -> list[tuple[int, int]]:
    """``"B:P,B:P"`` -> [(concurrency, prompt tokens)]."""
    out = []
    for item in spec.split(","):
        b, _, p = item.partition(":")
        out.append((int(b), int(p)))
    return out


def report(tokens: np.ndarray, kv: np.ndarray, rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Fit ``(c_fix, c_tok, c_kv, c_row)`` to the steps and print it with its error."""
    from agentspec_mw.costfit import fit_step_times

    coef = fit_step_times(tokens, kv, rows, seconds)
    pred = coef[0] + coef[1] * tokens + coef[2] * kv + coef[3] * rows
    rel = (pred - seconds) / seconds
    decode = rows == tokens
    print(
        f"fit: c_fix {coef[0] * 1e3:.2f} ms + c_tok {coef[1] * 1e3:.3f} ms/token + "
        f"c_kv {coef[2] * 1e6:.2f} us/KV token + c_row {coef[3] * 1e3:.3f} ms/row "
        f"({len(seconds)} steps)"
    )
    for name, m in (("all", np.ones_like(decode)), ("decode", decode), ("prefill", ~decode)):
        if m.any():
            print(
                f"  {name:8s} {int(m.sum()):4d} steps: |error| median "
                f"{np.median(np.abs(rel[m])) * 100:.1f} %, p90 "
                f"{np.percentile(np.abs(rel[m]), 90) * 100:.1f} %; predicted / measured time "
                f"{pred[m].sum() / seconds[m].sum():.3f}"
            )
    return coef


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument(
        "--grid",
        default="1:16,1:1024,4:256,8:16,8:1024,16:256,32:16,32:512,64:16,64:128",
        help="concurrency:prompt_tokens pairs",
    )
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument(
        "--time",
        choices=("wall", "cpu"),
        default="wall",
        help="fit wall seconds per step, or the engine thread's CPU seconds (load-robust)",
    )
    ap.add_argument(
        "--from-steps",
        default=None,
        help="fit a steps file of `replay_validation.py live --steps-prefix` (serving steps, "
        "drafts included) instead of running the grid",
    )
    args = ap.parse_args(argv)
    if args.from_steps:
        with open(args.from_steps) as fh:
            live = np.array(json.load(fh), dtype=np.float64)
        # columns: tokens, kv, requests, core_s, llm_engine_s, drafts, cpu_s
        report(
            live[:, 0],
            live[:, 1],
            live[:, 2] + live[:, 5],
            live[:, 3 if args.time == "wall" else 6],
        )
        return 0

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from agentspec_mw_vllm.engine import build_llm

    llm = build_llm(args.model, speculative=None, max_model_len=2048)
    core: Any = llm.llm_engine.engine_core.engine_core
    sched = core.scheduler
    block_size = sched.cache_config.block_size
    kv_tokens = sched.kv_cache_manager.block_pool.num_gpu_blocks * block_size
    budget = sched.scheduler_config.max_num_batched_tokens
    steps: list[tuple[int, int, float, int, float]] = []
    last: dict[str, Any] = {}
    orig_schedule = sched.schedule

    def schedule(*a: Any, **kw: Any) -> Any:
        out = orig_schedule(*a, **kw)
        last["n"] = out.total_num_scheduled_tokens
        last["kv"] = sum(sched.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
        last["seqs"] = len(out.num_scheduled_tokens)
        return out

    sched.schedule = schedule
    orig_step = core.step_fn

    def step() -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = orig_step()
        dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
        if last.get("n"):
            steps.append((int(last["n"]), int(last["kv"]), dt, int(last["seqs"]), cpu))
        last.clear()
        return out

    core.step_fn = step
    rng = np.random.default_rng(args.seed)
    vocab = 40000
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], params, use_tqdm=False)  # warm-up
    steps.clear()
    for b, p in _grid(args.grid):
        prompts = [
            TokensPrompt(prompt_token_ids=rng.integers(100, vocab, p).tolist()) for _ in range(b)
        ]
        t0 = time.perf_counter()
        n0 = len(steps)
        llm.generate(prompts, params, use_tqdm=False)
        print(
            f"B={b:3d} prompt={p:5d}: {len(steps) - n0} steps, {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    print(
        f"token budget max_num_batched_tokens={budget}, KV capacity {kv_tokens} tokens "
        f"({sched.kv_cache_manager.block_pool.num_gpu_blocks} blocks of {block_size}), "
        f"prefix caching={sched.cache_config.enable_prefix_caching}"
    )
    arr = np.array(steps, dtype=np.float64)
    coef = report(arr[:, 0], arr[:, 1], arr[:, 3], arr[:, 2 if args.time == "wall" else 4])
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(
                {
                    **dict(zip(("c_fix", "c_tok", "c_kv", "c_row"), coef.tolist(), strict=True)),
                    "time": args.time,
                    "max_num_batched_tokens": budget,
                    "kv_capacity_tokens": kv_tokens,
                    "block_size": block_size,
                    "prefix_caching": bool(sched.cache_config.enable_prefix_caching),
                    "columns": ["tokens", "kv", "wall_s", "requests", "cpu_s"],
                    "steps": steps,
                },
                fh,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
