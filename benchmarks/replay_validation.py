"""Validate ``agentspec replay`` against the real engine: record, run live, compare.

A small sequential multi-agent LangGraph workflow (planner -> researcher -> writer ->
editor, each call's prompt carrying the previous outputs) over one topic per query, on
the embedded vLLM engine (default model, float32, eager, vLLM's CPU defaults: 4096-token
budget, 256 sequences, 1 GiB of KV cache).

``record``: one run without speculation, every call written by the LangGraph adapter's
``TraceRecorder`` (``TaggingConfig(trace_path=...)``) — the model's own outputs.

``live``: for each drafter and concurrency N, a fresh engine runs the first ``queries(N)``
queries with at most N in flight (``graph.batch(..., max_concurrency=N)``); printed and
written per (drafter, N): output tokens (the engine's), wall seconds, tokens/s, drafted
and accepted tokens, a digest of the final states (every drafter's must equal the
no-speculation run's), the process's CPU seconds and the engine's steps summed (wall
and the engine thread's CPU seconds in ``EngineCore.step``); ``--steps-prefix`` also
writes every step. ``--topics-from`` runs a recording's own first runs.

``direct``: the recording's calls on the engine without LangGraph (one client thread,
``LLMEngine.add_request`` / ``step``): what LangGraph's threads add to a live run.

``compare``: live JSONs (a (drafter, N) run more than once counts by its median) beside
``agentspec replay --json`` reports of the recording (one per N, made with ``--max-runs
queries(N) --batch N --cost-model cpu-smollm2``): measured speedups over ``none`` by wall
time and by the engine's CPU time, and the predicted ones, at each N.

    python benchmarks/replay_validation.py record --out val/trace.jsonl --queries 32
    python benchmarks/replay_validation.py live --out val/live.json --concurrency 1,8,32 \
        --topics-from val/trace.jsonl --steps-prefix val/steps-
    agentspec replay --traces val/trace.jsonl --tokenizer MODEL_DIR --cost-model cpu-smollm2 \
        --proposers none,ngram,suffix,agentspec --batch 8 --max-runs 8 --json val/replay8.json
    python benchmarks/replay_validation.py compare val/live*.json val/replay*.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

TOPICS: tuple[str, ...] = (
    "tea", "coffee", "bread", "cheese", "rice", "salt", "glass", "paper",
    "steel", "cotton", "wool", "silk", "honey", "chocolate", "soap", "candles",
    "bicycles", "clocks", "bridges", "maps", "kites", "violins", "pottery", "wine",
    "ink", "rubber", "copper", "lenses", "compasses", "sails", "bells", "dyes",
)  # fmt: skip
DRAFTERS: dict[str, str | None] = {
    "none": None,
    "ngram": "ngram",
    "suffix": "suffix",
    "agentspec": "agentspec",
}


def queries_at(n: int) -> int:
    """Queries run at concurrency ``n``: ``n`` of them, at least 2."""
    return max(2, n)


class State(TypedDict):
    topic: str
    plan: str
    notes: str
    report: str
    final: str


def build_graph(model: Any) -> Any:
    """planner -> researcher -> writer -> editor, each an agent of its own."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph import END, START, StateGraph

    def ask(system: str, user: str) -> str:
        return str(model.invoke([SystemMessage(system), HumanMessage(user)]).content).strip()

    def planner(s: State) -> dict[str, str]:
        return {
            "plan": ask(
                "You are a planner. Answer with a short numbered plan.",
                f"Plan a short report about {s['topic']} in three steps.",
            )
        }

    def researcher(s: State) -> dict[str, str]:
        return {
            "notes": ask(
                "You are a researcher. Write short factual notes.",
                f"Topic: {s['topic']}\nPlan:\n{s['plan']}\nWrite one note per step of the plan.",
            )
        }

    def writer(s: State) -> dict[str, str]:
        return {
            "report": ask(
                "You are a writer.",
                f"Notes about {s['topic']}:\n{s['notes']}\nWrite a short report from these notes.",
            )
        }

    def editor(s: State) -> dict[str, str]:
        return {
            "final": ask(
                "You are an editor. Repeat the report with any mistakes fixed.",
                f"Report about {s['topic']}:\n{s['report']}",
            )
        }

    g = StateGraph(State)
    for name, fn in (
        ("planner", planner),
        ("researcher", researcher),
        ("writer", writer),
        ("editor", editor),
    ):
        g.add_node(name, fn)
    g.add_edge(START, "planner")
    g.add_edge("planner", "researcher")
    g.add_edge("researcher", "writer")
    g.add_edge("writer", "editor")
    g.add_edge("editor", END)
    return g.compile()


def topics_in(trace: Path) -> list[str]:
    """The topics of a recording's runs in the order they first appear (the order
    ``agentspec replay --max-runs`` takes runs in)."""
    out: list[str] = []
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        if rec["agent"] == "planner":
            m = re.search(r"report about (.+) in three steps", rec["prompt"][-1]["content"])
            if m and m.group(1) not in out:
                out.append(m.group(1))
    return out


def _states(n: int, topics: Sequence[str] = TOPICS) -> list[State]:
    return [State(topic=t, plan="", notes="", report="", final="") for t in topics[:n]]


def _engine(drafter: str | None, k: int, cost_model: str = "cpu-smollm2") -> Any:
    from agentspec_mw_vllm.engine import build_llm

    options: dict[str, Any] = {"disable_log_stats": False}
    if drafter is not None:
        options["per_request_spec_decode_metrics"] = "summary"
    if drafter == "agentspec":
        options["cost_model"] = cost_model
    return build_llm(None, speculative=drafter, k=k, max_model_len=2048, **options)


Step = tuple[int, int, int, float, float, int, float]


def _engine_times(steps: list[Step]) -> dict[str, float]:
    """The run's engine steps summed: wall seconds in ``EngineCore.step`` and the engine
    thread's CPU seconds in it (empty when the engine core runs in another process)."""
    if not steps:
        return {}
    return {
        "engine_steps": len(steps),
        "engine_wall_s": round(sum(s[3] for s in steps), 3),
        "engine_cpu_s": round(sum(s[6] for s in steps), 3),
    }


def _time_steps(llm: Any, steps: list[Step]) -> None:
    """Record each engine step: (tokens scheduled, KV tokens of the scheduled requests
    after it, requests scheduled, seconds in ``EngineCore.step``, seconds in
    ``LLMEngine.step`` — the core step plus output processing —, draft tokens scheduled,
    CPU seconds the engine's thread spent in ``EngineCore.step``: wall minus CPU is time
    the thread waited, for the GIL or for a core other processes held)."""
    engine = llm.llm_engine
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:  # the engine core runs in its own process: nothing to time here
        return
    sched = core.scheduler
    last: dict[str, Any] = {}
    orig_schedule, orig_core, orig_step = sched.schedule, core.step_fn, engine.step

    def schedule(*a: Any, **kw: Any) -> Any:
        out = orig_schedule(*a, **kw)
        last["n"] = out.total_num_scheduled_tokens
        last["seqs"] = len(out.num_scheduled_tokens)
        last["kv"] = sum(sched.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
        last["drafts"] = sum(map(len, out.scheduled_spec_decode_tokens.values()))
        return out

    def core_step() -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        out = orig_core()
        last["core_s"] = time.perf_counter() - t0
        last["cpu_s"] = time.thread_time() - c0
        return out

    def step() -> Any:
        t0 = time.perf_counter()
        out = orig_step()
        total = time.perf_counter() - t0
        if last.get("n"):
            steps.append(
                (
                    last["n"],
                    last["kv"],
                    last["seqs"],
                    last["core_s"],
                    total,
                    last["drafts"],
                    last["cpu_s"],
                )
            )
        last.clear()
        return out

    sched.schedule, core.step_fn, engine.step = schedule, core_step, step


def _run(
    drafter: str | None,
    k: int,
    n: int,
    max_tokens: int,
    trace: Path | None = None,
    steps_out: Path | None = None,
    topics: Sequence[str] = TOPICS,
) -> dict[str, Any]:
    from vllm import SamplingParams

    from agentspec_mw_langgraph.config import TaggingConfig
    from agentspec_mw_langgraph.demo import MeteredBackend, _totals
    from agentspec_mw_langgraph.engine_chat import ChatAgentSpecVLLM
    from agentspec_mw_langgraph.wrap import with_agentspec
    from agentspec_mw_vllm.engine import shutdown

    llm = _engine(drafter, k)
    steps: list[Step] = []
    try:
        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        backend = MeteredBackend(llm)
        chat = ChatAgentSpecVLLM(engine=backend, max_tokens=max_tokens)
        chat.invoke("Hello")
        backend.reset()
        _time_steps(llm, steps)  # the workload's steps only (the engine is idle here)
        config = TaggingConfig(trace_path=trace, trace_workload="validation")
        app = with_agentspec(build_graph(chat), config=config)
        states = _states(queries_at(n), topics)
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        outs = app.batch(states, config={"max_concurrency": n})
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        load1 = os.getloadavg()[0]
    finally:
        shutdown(llm)
    if steps_out is not None:
        steps_out.write_text(json.dumps(steps))
    total = _totals(dict(backend.per_agent))
    digest = hashlib.sha256(json.dumps([dict(o) for o in outs], sort_keys=True).encode())
    return {
        "concurrency": n,
        "queries": len(states),
        "output_tokens": total.output_tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(total.output_tokens / wall, 3),
        "drafted": total.drafted,
        "accepted": total.accepted,
        "outputs_sha256": digest.hexdigest(),
        "process_cpu_s": round(cpu, 3),
        **_engine_times(steps),
        "loadavg_1m": [round(load0, 2), round(load1, 2)],
    }


def recorded_calls(trace: Path, runs: int) -> list[list[list[dict[str, Any]]]]:
    """The prompts (chat messages) of a recording's first ``runs`` runs, per run in call
    order (the runs ``agentspec replay --max-runs`` keeps, in its order)."""
    by_run: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        by_run.setdefault(rec["run_id"], []).append((rec["call_index"], rec["prompt"]))
    return [[p for _, p in sorted(calls, key=lambda c: c[0])] for calls in by_run.values()][:runs]


def _run_direct(
    trace: Path,
    k: int,
    n: int,
    max_tokens: int,
    steps_out: Path | None,
    drafter: str | None = None,
    cost_model: str = "cpu-smollm2",
) -> dict[str, Any]:
    """The recording's calls on the engine without LangGraph: one thread adds each run's
    next call to the engine (``LLMEngine.add_request``) when its previous call finishes
    and steps the engine itself; ``n`` runs in flight (all of ``queries(n)`` at once when
    ``n`` >= that), ``drafter`` as in ``live``. Greedy decoding reproduces the recorded
    outputs."""
    from vllm import SamplingParams

    from agentspec_mw_langgraph.toolformat import render_chat_prompt
    from agentspec_mw_vllm.engine import shutdown

    llm = _engine(drafter, k, cost_model)
    steps: list[Step] = []
    runs = recorded_calls(trace, queries_at(n))
    try:
        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        tok = llm.get_tokenizer()
        prompts = [
            [tok.encode(render_chat_prompt(tok, m, None), add_special_tokens=False) for m in run]
            for run in runs
        ]
        _time_steps(llm, steps)
        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        nxt = [0] * len(runs)
        waiting = list(range(len(runs)))
        output_tokens = 0

        def start(i: int) -> None:
            prompt = llm._preprocess_cmpl_one({"prompt_token_ids": prompts[i][nxt[i]]})
            engine.add_request(f"{i}-{nxt[i]}", prompt, params)
            nxt[i] += 1

        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(min(n, len(runs))):
            start(waiting.pop(0))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    output_tokens += len(out.outputs[0].token_ids)
                    i = int(out.request_id.split("-")[0])
                    if nxt[i] < len(prompts[i]):
                        start(i)
                    elif waiting:
                        start(waiting.pop(0))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        load1 = os.getloadavg()[0]
    finally:
        shutdown(llm)
    if steps_out is not None:
        steps_out.write_text(json.dumps(steps))
    return {
        "drafter": drafter or "none",
        "client": "direct",
        "concurrency": n,
        "queries": len(runs),
        "output_tokens": output_tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(output_tokens / wall, 3),
        "process_cpu_s": round(cpu, 3),
        **_engine_times(steps),
        "loadavg_1m": [round(load0, 2), round(load1, 2)],
    }


def cmd_direct(args: argparse.Namespace) -> int:
    steps = Path(args.steps) if args.steps else None
    r = _run_direct(Path(args.trace), args.k, args.concurrency, args.max_tokens, steps)
    print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(r, indent=1))
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        out.unlink()
    r = _run(None, args.k, args.queries, args.max_tokens, trace=out)
    r["queries"] = args.queries
    print(json.dumps(r))
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    out = Path(args.out)
    rows: list[dict[str, Any]] = json.loads(out.read_text()) if out.exists() else []
    done = {(r["drafter"], r["concurrency"]) for r in rows}
    topics = topics_in(Path(args.topics_from)) if args.topics_from else list(TOPICS)
    for n in [int(x) for x in args.concurrency.split(",")]:
        for name in args.drafters.split(","):
            if (name, n) in done:
                continue
            steps = Path(f"{args.steps_prefix}{name}-{n}.json") if args.steps_prefix else None
            r = {
                "drafter": name,
                **_run(DRAFTERS[name], args.k, n, args.max_tokens, None, steps, topics),
            }
            print(json.dumps(r), flush=True)
            rows.append(r)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(rows, indent=1))
    return 0


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def cmd_compare(args: argparse.Namespace) -> int:
    """Measured against predicted speedups. Every file is either a ``live`` JSON (a list
    of runs; a (drafter, N) run more than once -- e.g. from two files -- counts by its
    median) or an ``agentspec replay --json`` report. Two measured speedups: by wall
    time (tokens/s), and by the engine thread's CPU seconds in its steps (tokens per
    engine-CPU second; what the run costs the engine, without the time its thread
    waited for a core or the GIL)."""
    meas: dict[tuple[str, int], list[dict[str, Any]]] = {}
    pred: dict[tuple[str, int], dict[str, Any]] = {}
    for path in args.files:
        data = json.loads(Path(path).read_text())
        if isinstance(data, list):
            for r in data:
                meas.setdefault((r["drafter"], r["concurrency"]), []).append(r)
            continue
        for row in data["results"]:
            if row["workload"] == "ALL":
                pred[(row["proposer"], row["batch"])] = row

    def tok_s(runs: list[dict[str, Any]]) -> float:
        return _median([r["tok_s"] for r in runs])

    def cpu_tok_s(runs: list[dict[str, Any]]) -> float:
        xs = [r["output_tokens"] / r["engine_cpu_s"] for r in runs if r.get("engine_cpu_s")]
        return _median(xs) if xs else float("nan")

    def err(p: float, m: float) -> str:
        return f"{(p / m - 1) * 100:+.1f} %" if m == m and p == p else "—"

    print(
        "| drafter | N | runs | measured tok/s | measured speedup | error | engine-CPU tok/s "
        "| engine-CPU speedup | error | predicted tok/s | predicted speedup | identical outputs |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    nan = float("nan")
    for (name, n), runs in sorted(
        meas.items(), key=lambda x: (x[0][1], list(DRAFTERS).index(x[0][0]))
    ):
        base = meas.get(("none", n))
        p = pred.get((name, n))
        m_speed = tok_s(runs) / tok_s(base) if base else nan
        c_speed = cpu_tok_s(runs) / cpu_tok_s(base) if base else nan
        p_speed = p["speedup"] if p else nan
        p_tok = p["throughput_tok_s"] if p else nan
        digests = {r["outputs_sha256"] for r in runs + (base or [])}
        print(
            f"| {name} | {n} | {len(runs)} | {tok_s(runs):.1f} | {m_speed:.3f} "
            f"| {err(p_speed, m_speed)} | {cpu_tok_s(runs):.1f} | {c_speed:.3f} "
            f"| {err(p_speed, c_speed)} | {p_tok:.1f} | {p_speed:.3f} "
            f"| {'yes' if len(digests) == 1 else 'NO'} |"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", required=True)
    rec.add_argument("--queries", type=int, default=32)
    live = sub.add_parser("live")
    live.add_argument("--out", required=True)
    live.add_argument("--concurrency", default="1,8,32")
    live.add_argument("--drafters", default=",".join(DRAFTERS))
    live.add_argument(
        "--topics-from",
        default=None,
        help="a recording: run its queries in its run order (the replay's --max-runs subset)",
    )
    live.add_argument(
        "--steps-prefix",
        default=None,
        help="write each run's timed engine steps to PREFIX<drafter>-<N>.json",
    )
    direct = sub.add_parser(
        "direct", help="the recording's calls without LangGraph (one client thread), no drafter"
    )
    direct.add_argument("trace")
    direct.add_argument("--concurrency", type=int, default=32)
    direct.add_argument("--steps", default=None, help="write the timed engine steps here")
    direct.add_argument("--out", default=None)
    for p in (rec, live, direct):
        p.add_argument("--k", type=int, default=8)
        p.add_argument("--max-tokens", type=int, default=64)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument(
        "files", nargs="+", help="live JSONs (repeats allowed) and agentspec replay --json reports"
    )
    args = ap.parse_args(argv)
    cmds = {"record": cmd_record, "live": cmd_live, "direct": cmd_direct, "compare": cmd_compare}
    return cmds[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
