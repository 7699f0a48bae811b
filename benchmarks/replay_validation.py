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
and accepted tokens, and whether every final state equals the no-speculation run's.

``compare``: the live JSON beside ``agentspec replay --json`` reports of the recording
(one per N, made with ``--max-runs queries(N) --batch N --cost-model cpu-smollm2``):
measured and predicted speedups over ``none`` at each N.

    python benchmarks/replay_validation.py record --out val/trace.jsonl --queries 32
    python benchmarks/replay_validation.py live --out val/live.json --concurrency 1,8,32
    agentspec replay --traces val/trace.jsonl --tokenizer MODEL_DIR --cost-model cpu-smollm2 \
        --proposers none,ngram,suffix,agentspec --batch 8 --max-runs 8 --json val/replay8.json
    python benchmarks/replay_validation.py compare val/live.json val/replay*.json
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


def _engine(drafter: str | None, k: int) -> Any:
    from agentspec_mw_vllm.engine import build_llm

    options: dict[str, Any] = {"disable_log_stats": False}
    if drafter is not None:
        options["per_request_spec_decode_metrics"] = "summary"
    if drafter == "agentspec":
        options["cost_model"] = "cpu-smollm2"
    return build_llm(None, speculative=drafter, k=k, max_model_len=2048, **options)


def _time_steps(llm: Any, steps: list[tuple[int, int, int, float, float]]) -> None:
    """Record each engine step: (tokens scheduled, KV tokens of the scheduled requests
    after it, requests scheduled, seconds in ``EngineCore.step``, seconds in
    ``LLMEngine.step`` — the core step plus output processing)."""
    engine = llm.llm_engine
    core = engine.engine_core.engine_core
    sched = core.scheduler
    last: dict[str, Any] = {}
    orig_schedule, orig_core, orig_step = sched.schedule, core.step_fn, engine.step

    def schedule(*a: Any, **kw: Any) -> Any:
        out = orig_schedule(*a, **kw)
        last["n"] = out.total_num_scheduled_tokens
        last["seqs"] = len(out.num_scheduled_tokens)
        last["kv"] = sum(sched.requests[r].num_computed_tokens for r in out.num_scheduled_tokens)
        return out

    def core_step() -> Any:
        t0 = time.perf_counter()
        out = orig_core()
        last["core_s"] = time.perf_counter() - t0
        return out

    def step() -> Any:
        t0 = time.perf_counter()
        out = orig_step()
        total = time.perf_counter() - t0
        if last.get("n"):
            steps.append((last["n"], last["kv"], last["seqs"], last["core_s"], total))
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
    steps: list[tuple[int, int, int, float, float]] = []
    try:
        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        if steps_out is not None:
            _time_steps(llm, steps)
        backend = MeteredBackend(llm)
        chat = ChatAgentSpecVLLM(engine=backend, max_tokens=max_tokens)
        chat.invoke("Hello")
        backend.reset()
        config = TaggingConfig(trace_path=trace, trace_workload="validation")
        app = with_agentspec(build_graph(chat), config=config)
        states = _states(queries_at(n), topics)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        outs = app.batch(states, config={"max_concurrency": n})
        wall = time.perf_counter() - t0
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
        "loadavg_1m": [round(load0, 2), round(load1, 2)],
    }


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


def cmd_compare(args: argparse.Namespace) -> int:
    live = json.loads(Path(args.live).read_text())
    meas: dict[tuple[str, int], dict[str, Any]] = {
        (r["drafter"], r["concurrency"]): r for r in live
    }
    pred: dict[tuple[str, int], dict[str, Any]] = {}
    for path in args.replays:
        for row in json.loads(Path(path).read_text())["results"]:
            if row["workload"] == "ALL":
                pred[(row["proposer"], row["batch"])] = row
    print(
        "| drafter | N | measured tok/s | measured speedup | predicted tok/s "
        "| predicted speedup | error | identical outputs |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (name, n), r in sorted(
        meas.items(), key=lambda x: (x[0][1], list(DRAFTERS).index(x[0][0]))
    ):
        base = meas.get(("none", n))
        p = pred.get((name, n))
        m_speed = r["tok_s"] / base["tok_s"] if base else float("nan")
        p_speed = p["speedup"] if p else float("nan")
        p_tok = p["throughput_tok_s"] if p else float("nan")
        same = base is not None and r["outputs_sha256"] == base["outputs_sha256"]
        print(
            f"| {name} | {n} | {r['tok_s']:.1f} | {m_speed:.3f} | {p_tok:.1f} | {p_speed:.3f} "
            f"| {(p_speed / m_speed - 1) * 100:+.1f} % | {'yes' if same else 'NO'} |"
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
    for p in (rec, live):
        p.add_argument("--k", type=int, default=8)
        p.add_argument("--max-tokens", type=int, default=64)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("live")
    cmp_.add_argument("replays", nargs="+")
    args = ap.parse_args(argv)
    return {"record": cmd_record, "live": cmd_live, "compare": cmd_compare}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
