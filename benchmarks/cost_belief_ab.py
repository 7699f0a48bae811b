"""Replay A/B: AgentSpec's budget reading a different step-time model than the engine has.

The replay charges every step by ``--engine`` (default ``llama8b-h200``, the ridge form measured
on an H200); each ``--beliefs`` entry is the model AgentSpec's budget reads: a preset name;
``linear-fit``, the linear form fitted (``fit_step_times``) to the GPU steps in ``--gpu-steps``
(what a linear fit of that engine would settle on); or ``measured:<preset>``, the online fit
(:class:`~agentspec_mw.costfit.MeasuredStepTime`, ``cost_model="measured"`` in vLLM)
warm-started from ``<preset>`` and fed every step the replay charges, as the vLLM adapter feeds
it the engine's timed steps; or ``scaled:<preset>:<field>[+<field>...]:<factor>``, a preset with
those coefficients scaled (e.g. ``scaled:cpu-smollm2:c_spec_kv+c_draft_kv:0``, drafts priced
without their context); ``--tags`` as ``agentspec replay``'s. ``--blind`` hides the waiting
prompts from AgentSpec (``StepContext.num_prefill_tokens = None``), as the vLLM adapter's model
runner is (the budget then takes prompts to fill the step); ``--blind hint`` tells it only what
the runner could infer, that nothing waited when the step before left budget unused
(``num_prefill_tokens = 0``, else ``None``). SuffixDecoding runs under the same charges. Prints,
per trace and batch, each method's predicted speedup over no speculation and its accepted /
drafted tokens. Deterministic.

    python benchmarks/cost_belief_ab.py --traces ../shared/traces/react_fever_webshop.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 8,32,64,256
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from _replay_setup import load_workloads
from fit_gpu_steps import load as load_gpu_steps

from agentspec_mw.costfit import MeasuredStepTime, fit_step_times
from agentspec_mw.costmodel import StepTimeModel, get_cost_model
from agentspec_mw.proposer import ProposerEnv, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import StepRecord, replay_workload

_GPU_STEPS = sorted(
    str(p) for p in (Path(__file__).parents[1] / "docs" / "results").glob("gpu_steps_h200_*.json")
)


def linear_fit(paths: list[str], engine: StepTimeModel) -> StepTimeModel:
    """The linear form fitted to the GPU steps of ``paths`` (the faster attention variant
    of each), with ``engine``'s serving limits."""
    st = load_gpu_steps([Path(p) for p in paths])
    c_fix, c_tok, c_kv, c_row = fit_step_times(
        st["tokens"], st["kv"], st["rows"], st["seconds"]
    ).tolist()
    return StepTimeModel(
        name="linear-fit",
        c_fix=c_fix,
        c_tok=c_tok,
        c_kv=c_kv,
        c_row=c_row,
        c_oh=0.0,
        limits=engine.limits,
    )


class _Blind:
    """A proposer that sees every step without its waiting prompts (as in vLLM).

    With ``hint``, it is told what a vLLM host can tell from the step before: when that
    step left part of the token budget unused, nothing was waiting
    (``num_prefill_tokens = 0``); otherwise unknown (``None``)."""

    def __init__(self, inner: Any, hint: bool = False) -> None:
        self._inner = inner
        self.name = inner.name
        self._hint = hint
        self._last: StepRecord | None = None

    def observe(self, rec: StepRecord) -> None:
        self._last = rec

    def propose(self, req_ids: Any, k: int, step: StepContext) -> Any:
        waiting = None
        last, budget = self._last, step.max_num_batched_tokens
        if self._hint and last is not None and budget is not None:
            if last.prefill_tokens + last.decoding + last.draft_tokens < budget:
                waiting = 0
        return self._inner.propose(req_ids, k, replace(step, num_prefill_tokens=waiting))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


def _chain(
    first: Callable[[StepRecord], None], then: Callable[[StepRecord], None] | None
) -> Callable[[StepRecord], None]:
    """An ``on_step`` calling ``first`` and then ``then`` (if any)."""

    def both(rec: StepRecord) -> None:
        first(rec)
        if then is not None:
            then(rec)

    return both


def _feeder(fit: MeasuredStepTime) -> Callable[[StepRecord], None]:
    """An ``on_step`` that gives ``fit`` each replayed step as the vLLM adapter gives it
    the engine's: batched tokens, KV, seconds (the replay has no host work per emitted
    token)."""

    def feed(rec: StepRecord) -> None:
        batched = rec.prefill_tokens + rec.decoding + rec.draft_tokens
        fit.observe(batched, rec.kv_tokens, rec.time_s, rec.spec_kv, rec.draft_kv)

    return feed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--engine", default="llama8b-h200", help="the preset the replay charges")
    ap.add_argument("--beliefs", default="llama8b-h200,linear-fit,llama8b-h100")
    ap.add_argument("--gpu-steps", nargs="+", default=_GPU_STEPS)
    ap.add_argument("--batch", default="8,32,64,256")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument("--tags", choices=["trace", "none"], default="trace")
    ap.add_argument(
        "--blind",
        nargs="?",
        const="full",
        choices=["full", "hint"],
        help="AgentSpec does not see the waiting prompts (vLLM); with 'hint', it is told "
        "when the step before left budget unused (nothing waited)",
    )
    args = ap.parse_args(argv)
    engine = get_cost_model(args.engine)
    beliefs: dict[str, StepTimeModel | None] = {}
    for name in args.beliefs.split(","):
        if name == "linear-fit":
            beliefs[name] = linear_fit(args.gpu_steps, engine)
        elif name.startswith("scaled:"):  # scaled:<preset>:<field>[+<field>...]:<factor>
            parts = name.split(":")
            fields = parts[2].split("+") if len(parts) == 4 else []
            if not fields or not all(f.startswith("c_") for f in fields):
                ap.error(f"{name!r}: write scaled:<preset>:<c_field>[+<c_field>...]:<factor>")
            preset = parts[1]
            try:
                factor = float(parts[3])
            except ValueError:
                ap.error(f"{name!r}: the factor {parts[3]!r} is not a number")
            preset_model = get_cost_model(preset)
            for field in fields:
                if field not in StepTimeModel.model_fields:
                    ap.error(f"{name!r}: {field!r} is not a StepTimeModel coefficient")
            # validated: model_copy would take a negative or NaN factor as it comes
            beliefs[name] = StepTimeModel.model_validate(
                preset_model.model_dump()
                | {f: getattr(preset_model, f) * factor for f in fields}
                | {"name": name}
            )
        elif name.startswith("measured:"):
            get_cost_model(name.split(":", 1)[1])  # a preset, or a clear error now
            beliefs[name] = None  # a fresh fit per replay
        else:
            beliefs[name] = get_cost_model(name)
        print(f"belief {name}: {beliefs[name]!r}")
    cols = ["suffix", *(f"agentspec[{n}]" for n in beliefs)]
    print(
        f"engine {args.engine}, k = {args.k}"
        + (f", AgentSpec blind to prefill ({args.blind})" if args.blind else "")
    )
    print(f"{'trace':22s} {'b':>3s} " + " ".join(f"{c:>28s}" for c in cols))
    for trace in args.traces:
        setup = load_workloads(
            [trace],
            args.tokenizer,
            max_k=args.k,
            cost_model=args.engine,
            max_calls_per_run=args.max_calls_per_run,
            tags=args.tags,
        )
        for name, calls in setup.workloads.items():
            for b in (int(x) for x in args.batch.split(",")):
                base = replay_workload(
                    calls, make_proposer("none", setup.env), batch=b, k=0, cost_model=engine
                )
                cells = []
                for col in cols:
                    on_step = None
                    fit: MeasuredStepTime | None = None
                    if col == "suffix":
                        prop = make_proposer("suffix", setup.env)
                    else:
                        belief = col[len("agentspec[") : -1]
                        model = beliefs[belief]
                        if model is None:
                            fit = MeasuredStepTime(prior=get_cost_model(belief.split(":", 1)[1]))
                            on_step = _feeder(fit)
                        env = ProposerEnv(
                            token_bytes=setup.env.token_bytes,
                            cost_model=model if fit is None else fit,
                            max_k=args.k,
                        )
                        prop = make_proposer("agentspec", env)
                        if args.blind:
                            blind = _Blind(prop, hint=args.blind == "hint")
                            prop = blind
                            if args.blind == "hint":
                                on_step = _chain(blind.observe, on_step)
                    run = replay_workload(
                        calls, prop, batch=b, k=args.k, cost_model=engine, on_step=on_step
                    )
                    if fit is not None:
                        print(f"  {col} b={b}: {fit.describe()}", flush=True)
                    speedup = base.sim_time_s / run.sim_time_s
                    cells.append(f"{speedup:6.3f}x {run.accepted:8d}/{run.drafted:8d}")
                print(f"{name[:22]:22s} {b:3d} " + " ".join(f"{c:>28s}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
