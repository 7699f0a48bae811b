"""What AgentSpec expects of its drafts for sampled requests, and whether they move greedy ones.

The calibration cells (docs/agentspec.md, "Calibration") pool every request of a scope,
whatever its decoding: a greedy request's draft token is accepted when it is the argmax, a
sampled one's with the model's probability of it (vLLM's rejection sampler with a draft
that carries no probabilities). This script runs the embedded engine (AgentSpec, the
default measured cost model) on rounds of short planning prompts, new topics each round,
in one of three modes:

* ``greedy`` — one agent (``g``) at temperature 0;
* ``sampled`` — one agent (``s``) at ``--temperature``, a seed per request;
* ``mixed`` — both, the same topics, in the same batches and scope;

and prints, per round and agent, the draft tokens vLLM verified and accepted and, of those
that carried the proposer's estimate, the acceptance it expected (the mean predicted
survival) against the acceptance realised (the adapter's counters,
:class:`agentspec_mw_vllm.metrics.MetricsSnapshot`). Comparing ``greedy`` with ``mixed``
shows what sampled traffic in the same cells does to greedy requests; ``sampled`` with
``mixed`` what greedy traffic does to sampled ones::

    python benchmarks/sampled_calibration.py --mode mixed --temperature 0.8
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from agentspec_mw.tags import StructureTags, tags_to_wire

TOPICS = (
    "the printing press, the steam engine, the telephone, antibiotics, the internet, "
    "the bicycle, photography, the compass, electric light, vaccines, the radio, aviation, "
    "the railway, paper money, the microscope, refrigeration, the telescope, maps, concrete, "
    "glass, the clock, the piano, the camera, the typewriter, the sewing machine, the "
    "elevator, the submarine, the rocket, the transistor, the laser, the satellite, the "
    "battery, the windmill, the plough, the wheel, the canal, the lighthouse, the bridge, "
    "the dam, the skyscraper, the newspaper, the library, the university, the hospital, "
    "the museum, the post office, the census, the calendar, the olympics, chess, football, "
    "tea, coffee, chocolate, sugar, salt, cotton, silk, rubber, oil, coal, steel, gold, silver"
).split(", ")


def _prompt(tokenizer: Any, topic: str, role: str) -> str:
    messages = [
        {"role": "system", "content": f"You are the {role}. Answer in numbered steps."},
        {"role": "user", "content": f"Write a short plan for an essay on the history of {topic}."},
    ]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def _params(agent: str, query: str, temperature: float, seed: int, max_tokens: int) -> Any:
    from vllm import SamplingParams

    wire = tags_to_wire(StructureTags(agent_id=agent, query_id=query))
    return SamplingParams(
        temperature=temperature,
        seed=seed if temperature > 0 else None,
        max_tokens=max_tokens,
        extra_args=wire,
    )


_FIELDS = ("drafted", "accepted", "estimated", "expected", "estimated_accepted")


def _delta(before: Any, after: Any, field: str, agent: str) -> float:
    """``field`` of two metrics snapshots, after less before, over the agent's blocks."""
    new, old = getattr(after, field), getattr(before, field)
    keys = [key for key in new if key.split("/")[0] == agent]
    return float(sum(new[key] - old.get(key, 0) for key in keys))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("greedy", "sampled", "mixed"), required=True)
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled agent")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=16, help="topics per round")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args(argv)
    if args.rounds * args.per_round > len(TOPICS):
        parser.error(f"--rounds x --per-round must be <= {len(TOPICS)} (new topics each round)")
    if args.temperature <= 0:
        parser.error("--temperature must be > 0")

    from agentspec_mw_vllm.engine import build_llm, shutdown
    from agentspec_mw_vllm.metrics import get_metrics

    llm = build_llm(speculative="agentspec", k=args.k, max_model_len=2048)
    tokenizer = llm.get_tokenizer()
    agents = {"greedy": ("g",), "sampled": ("s",), "mixed": ("g", "s")}[args.mode]
    print(f"mode {args.mode}, temperature {args.temperature} (agent s), k {args.k}")
    print("| round | agent | s | verified drafts | accepted | expected | realised |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    try:
        for rnd in range(args.rounds):
            prompts: list[str] = []
            params: list[Any] = []
            for i, topic in enumerate(TOPICS[rnd * args.per_round : (rnd + 1) * args.per_round]):
                for agent in agents:
                    sampled = agent == "s"
                    prompts.append(_prompt(tokenizer, topic, "writer" if sampled else "planner"))
                    temp = args.temperature if sampled else 0.0
                    query = f"q{rnd}_{i}"
                    params.append(_params(agent, query, temp, 1000 * rnd + i, args.max_tokens))
            before = get_metrics().snapshot()
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            after = get_metrics().snapshot()
            for agent in agents:
                d = {f: _delta(before, after, f, agent) for f in _FIELDS}
                n = d["estimated"]
                expected = 100 * d["expected"] / n if n else float("nan")
                realised = 100 * d["estimated_accepted"] / n if n else float("nan")
                print(
                    f"| {rnd} | {agent} | {seconds:.1f} | {d['drafted']:.0f} | "
                    f"{d['accepted']:.0f} | {expected:.1f} % | {realised:.1f} % |",
                    flush=True,
                )
    finally:
        shutdown(llm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
