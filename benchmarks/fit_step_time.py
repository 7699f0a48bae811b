"""Fit a step-time preset to the embedded engine's own steps (the ``cpu-smollm2`` preset).

Runs the embedded vLLM engine without speculation (default model unless ``--model``)
over a grid of concurrent requests × prompt lengths (random token ids, so the prefix
cache never hits), times every engine step (schedule + forward + sampling + bookkeeping,
``EngineCore.step``), and records per step the tokens it scheduled (prefill chunks +
decodes) and the KV tokens those requests hold after it. The steps go through
:class:`agentspec_mw.costfit.MeasuredStepTime` (the project's online fit; prior
``llama8b-h100`` with ``prior_steps=0``, no forgetting), and the script prints the
fitted constants, the engine's token budget and KV capacity, and the fit's error.

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
    args = ap.parse_args(argv)

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from agentspec_mw.costfit import MeasuredStepTime
    from agentspec_mw.costmodel import PRESETS
    from agentspec_mw_vllm.engine import build_llm

    llm = build_llm(args.model, speculative=None, max_model_len=2048)
    core: Any = llm.llm_engine.engine_core.engine_core
    sched = core.scheduler
    block_size = sched.cache_config.block_size
    kv_tokens = sched.kv_cache_manager.block_pool.num_gpu_blocks * block_size
    budget = sched.scheduler_config.max_num_batched_tokens
    steps: list[tuple[int, int, float]] = []
    last: dict[str, Any] = {}
    orig_schedule = sched.schedule

    def schedule(*a: Any, **kw: Any) -> Any:
        out = orig_schedule(*a, **kw)
        last["n"] = out.total_num_scheduled_tokens
        last["kv"] = sum(sched.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
        return out

    sched.schedule = schedule
    orig_step = core.step_fn

    def step() -> Any:
        t0 = time.perf_counter()
        out = orig_step()
        dt = time.perf_counter() - t0
        if last.get("n"):
            steps.append((int(last["n"]), int(last["kv"]), dt))
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
    fit = MeasuredStepTime(PRESETS["llama8b-h100"], prior_steps=0.0, half_life_steps=1e12)
    for n, kv, dt in steps:
        fit.observe(n, kv, dt)
    m = fit.model
    arr = np.array(steps, dtype=np.float64)
    pred = np.array([m.step_time(n, kv) for n, kv, _ in steps])
    rel = np.abs(pred - arr[:, 2]) / arr[:, 2]
    print(fit.describe())
    print(
        f"token budget max_num_batched_tokens={budget}, KV capacity {kv_tokens} tokens "
        f"({sched.kv_cache_manager.block_pool.num_gpu_blocks} blocks of {block_size}), "
        f"prefix caching={sched.cache_config.enable_prefix_caching}"
    )
    print(
        f"fit error: median {np.median(rel) * 100:.1f} %, p90 {np.percentile(rel, 90) * 100:.1f} %"
    )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(
                {
                    "c_fix": m.c_fix,
                    "c_tok": m.c_tok,
                    "c_kv": m.c_kv,
                    "steps_used": fit.observed,
                    "steps_skipped": fit.skipped,
                    "max_num_batched_tokens": budget,
                    "kv_capacity_tokens": kv_tokens,
                    "block_size": block_size,
                    "prefix_caching": bool(sched.cache_config.enable_prefix_caching),
                    "steps": steps,
                },
                fh,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
