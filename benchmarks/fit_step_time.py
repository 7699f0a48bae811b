"""Fit a step-time preset to the embedded engine's own steps (the ``cpu-smollm2`` preset).

Runs the embedded vLLM engine (default model unless ``--model``) over a grid of
concurrent requests × prompt lengths (random token ids, so the prefix cache never hits),
once per ``--drafts`` length (0: no speculation; ``d > 0``: a proposer that drafts ``d``
always-rejected tokens per request per step, ``_rejected_drafts.py``), times every engine
step (schedule + forward + sampling + bookkeeping, ``EngineCore.step``; wall seconds and
the engine thread's CPU seconds), and records per step the tokens it scheduled (prefill
chunks + decodes + drafts), the KV tokens its requests hold, its logits rows (requests +
drafts), and the drafts' features (KV tokens of the drafting requests; draft tokens × their
request's KV tokens). The steps are fitted with :func:`agentspec_mw.costfit.fit_step_times`
(``c_fix + c_tok N_batched + c_kv N_kv + c_row N_rows [+ c_spec_kv N_spec_kv + c_draft_kv
N_draft_kv]``, non-negative, relative error), and the script prints the constants, the
engine's token budget and KV capacity, and the fit's error on decode, drafted and prefill
steps. ``--from-steps`` fits the serving steps a live run recorded instead
(``replay_validation.py live --steps-prefix``; rows = requests + drafts).

    LD_PRELOAD="$(python -m agentspec_mw_vllm.preload)" \
    VLLM_ENABLE_V1_MULTIPROCESSING=0 NUMBA_NUM_THREADS=1 \
        python benchmarks/fit_step_time.py --time cpu --drafts 0,1,3,8 --json fit.json
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


def report(
    tokens: np.ndarray,
    kv: np.ndarray,
    rows: np.ndarray,
    seconds: np.ndarray,
    spec_kv: np.ndarray | None = None,
    draft_kv: np.ndarray | None = None,
    requests: np.ndarray | None = None,
) -> np.ndarray:
    """Fit ``(c_fix, c_tok, c_kv, c_row[, c_spec_kv, c_draft_kv])`` to the steps and print
    it with its error (decode steps with and without drafts apart; with ``requests``, the
    signed error of the steps without prefill, drafted or not, by how many requests they
    ran, which shows where a linear form bends)."""
    from agentspec_mw.costfit import fit_step_times

    coef = fit_step_times(tokens, kv, rows, seconds, spec_kv, draft_kv)
    pred = coef[0] + coef[1] * tokens + coef[2] * kv + coef[3] * rows
    line = (
        f"fit: c_fix {coef[0] * 1e3:.2f} ms + c_tok {coef[1] * 1e3:.3f} ms/token + "
        f"c_kv {coef[2] * 1e6:.2f} us/KV token + c_row {coef[3] * 1e3:.3f} ms/row"
    )
    drafted = np.zeros(len(seconds), dtype=bool)
    if spec_kv is not None and draft_kv is not None:
        pred = pred + coef[4] * spec_kv + coef[5] * draft_kv
        line += (
            f" + c_spec_kv {coef[4] * 1e6:.2f} us/KV token of a drafting request"
            f" + c_draft_kv {coef[5] * 1e6:.3f} us/(draft token x its KV token)"
        )
        drafted = spec_kv > 0
    print(f"{line} ({len(seconds)} steps)")
    rel = (pred - seconds) / seconds
    decode = (rows == tokens) & ~drafted
    spec = (rows == tokens) & drafted
    groups = (("all", np.ones_like(decode)), ("decode", decode), ("drafted", spec))
    for name, m in (*groups, ("prefill", rows != tokens)):
        if m.any():
            print(
                f"  {name:8s} {int(m.sum()):4d} steps: |error| median "
                f"{np.median(np.abs(rel[m])) * 100:.1f} %, p90 "
                f"{np.percentile(np.abs(rel[m]), 90) * 100:.1f} %; predicted / measured time "
                f"{pred[m].sum() / seconds[m].sum():.3f}"
            )
    if requests is not None:
        parts = []
        no_prefill = rows == tokens
        for r in np.unique(requests[no_prefill]):
            m = no_prefill & (requests == r)
            parts.append(
                f"{int(r)}: {np.median(rel[m]) * 100:+.1f} % ({int(m.sum())}, "
                f"{np.median(seconds[m]) * 1e3:.0f} ms)"
            )
        print(
            "  steps without prefill by requests, median signed error (steps, median time): "
            + "; ".join(parts)
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
    ap.add_argument(
        "--drafts",
        default="0",
        help="draft lengths to run the grid at, e.g. 0,1,3,8: each > 0 runs an engine whose "
        "proposer drafts that many always-rejected tokens per request per step "
        "(_rejected_drafts.py), so the steps differ from the 0 run only by the drafts",
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

    rng = np.random.default_rng(args.seed)
    vocab = 40000
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    # tokens, kv, wall, requests, cpu, drafts, spec_kv, draft_kv
    steps: list[tuple[int, int, float, int, float, int, int, int]] = []
    info: dict[str, Any] = {}
    for d in (int(x) for x in args.drafts.split(",")):
        spec = None if d == 0 else "_rejected_drafts:RejectedDrafts"
        llm = build_llm(args.model, speculative=spec, k=max(d, 1), max_model_len=2048)
        core: Any = llm.llm_engine.engine_core.engine_core
        sched = core.scheduler
        block_size = sched.cache_config.block_size
        info = {
            "max_num_batched_tokens": sched.scheduler_config.max_num_batched_tokens,
            "kv_capacity_tokens": sched.kv_cache_manager.block_pool.num_gpu_blocks * block_size,
            "blocks": sched.kv_cache_manager.block_pool.num_gpu_blocks,
            "block_size": block_size,
            "prefix_caching": bool(sched.cache_config.enable_prefix_caching),
        }
        last: dict[str, Any] = {}
        orig_schedule = sched.schedule

        def schedule(*a: Any, _s: Any = sched, _o: Any = orig_schedule, _l: Any = last) -> Any:
            out = _o(*a)
            spec_tokens = out.scheduled_spec_decode_tokens
            _l["n"] = out.total_num_scheduled_tokens
            _l["kv"] = kv = 0
            _l["seqs"] = len(out.num_scheduled_tokens)
            _l["drafts"] = _l["spec_kv"] = _l["draft_kv"] = 0
            for r in out.num_scheduled_tokens:
                computed = _s.requests[r].num_computed_tokens
                kv += computed
                nd = len(spec_tokens.get(r, ()))
                if nd:
                    _l["drafts"] += nd
                    _l["spec_kv"] += computed
                    _l["draft_kv"] += nd * computed
            _l["kv"] = kv
            return out

        sched.schedule = schedule
        orig_step = core.step_fn

        def step(_o: Any = orig_step, _l: Any = last) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            out = _o()
            dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
            if _l.get("n"):
                steps.append(
                    (
                        int(_l["n"]),
                        int(_l["kv"]),
                        dt,
                        int(_l["seqs"]),
                        cpu,
                        int(_l["drafts"]),
                        int(_l["spec_kv"]),
                        int(_l["draft_kv"]),
                    )
                )
            _l.clear()
            return out

        core.step_fn = step
        n_warm = len(steps)
        llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], params, use_tqdm=False)
        del steps[n_warm:]  # the warm-up request's steps are not the grid's
        last.clear()
        for b, p in _grid(args.grid):
            prompts = [
                TokensPrompt(prompt_token_ids=rng.integers(100, vocab, p).tolist())
                for _ in range(b)
            ]
            t0 = time.perf_counter()
            n0 = len(steps)
            llm.generate(prompts, params, use_tqdm=False)
            print(
                f"drafts={d} B={b:3d} prompt={p:5d}: {len(steps) - n0} steps, "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
        del llm, core, sched
    print(
        f"token budget max_num_batched_tokens={info['max_num_batched_tokens']}, KV capacity "
        f"{info['kv_capacity_tokens']} tokens ({info['blocks']} blocks of "
        f"{info['block_size']}), prefix caching={info['prefix_caching']}"
    )
    arr = np.array(steps, dtype=np.float64)
    with_drafts = bool(arr[:, 5].any())
    coef = report(
        arr[:, 0],
        arr[:, 1],
        arr[:, 3] + arr[:, 5],
        arr[:, 2 if args.time == "wall" else 4],
        arr[:, 6] if with_drafts else None,
        arr[:, 7] if with_drafts else None,
        arr[:, 3],
    )
    if args.json_out:
        names = ("c_fix", "c_tok", "c_kv", "c_row", "c_spec_kv", "c_draft_kv")
        with open(args.json_out, "w") as fh:
            json.dump(
                {
                    **dict(zip(names, coef.tolist(), strict=False)),
                    "time": args.time,
                    **{k: v for k, v in info.items() if k != "blocks"},
                    "columns": [
                        "tokens",
                        "kv",
                        "wall_s",
                        "requests",
                        "cpu_s",
                        "drafts",
                        "spec_kv",
                        "draft_kv",
                    ],
                    "steps": steps,
                },
                fh,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
