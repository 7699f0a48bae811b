"""Per-step proposer time when every live request brings its own hostile block grammar.

Replays a trace through the AgentSpec proposer at a full batch twice: *benign* (the
trace's tags: the default block grammar) and *hostile* (each run's tags carry their own
set of 32 block delimiters, so a full batch of 64 holds ~63 distinct grammars — the most
a proposer records). The hostile delimiters are built from the workload's own text to
cost the most: long (up to 64 bytes), most ending in a space (a byte every few tokens
ends), half of them the text's own 63-byte windows with one byte changed near the end (a
near miss: the automaton compares ~62 bytes wherever the window recurs), half exact
short windows (real block events). Prints the median per-step time over the steps with
the batch full (median of ``--repeats`` fresh replays each) and the ratio.

    python benchmarks/hostile_grammars.py --traces ../shared/traces/react_fever_webshop.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 64 --k 16
"""

from __future__ import annotations

import random
import time
from dataclasses import replace

import numpy as np
from _replay_setup import load_workloads, replay_parser

from agentspec_mw.agentspec.blocks import MAX_DELIM
from agentspec_mw.agentspec.grammars import MAX_GRAMMARS
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import ReplayCall, replay_workload
from agentspec_mw.tags import StructureTags

N_BLOCKS = 32  # the most a request's tags may carry


def space_blocks(text: str, seed: int) -> tuple[tuple[str, str], ...]:
    """32 delimiter pairs of 63-64 bytes ending in a space, each a run of spaces with one
    other byte at a different place: inside indentation every space byte compares each
    of the 64 delimiters up to that byte (~32 bytes each)."""
    other = chr(33 + seed % 90)
    blocks = []
    for i in range(N_BLOCKS):
        a, b = 2 * i, 2 * i + 1
        blocks.append(
            (
                " " * a + other + " " * (MAX_DELIM - 2 - a),
                " " * b + other + " " * (MAX_DELIM - 2 - b),
            )
        )
    return tuple(blocks)


def hostile_blocks(text: str, seed: int) -> tuple[tuple[str, str], ...]:
    """32 delimiter pairs from ``text`` (see the module docstring)."""
    rng = random.Random(seed)
    spaces = [i for i in range(MAX_DELIM, len(text)) if text[i] == " "]
    blocks: list[tuple[str, str]] = []
    while len(blocks) < N_BLOCKS and spaces:
        p = rng.choice(spaces)
        window = text[p - (MAX_DELIM - 2) : p + 1]
        short = text[p - 12 : p + 1]
        if not (window.isascii() and short.isascii()):
            continue
        near = window[:-2] + chr(1 + seed % 30) + window[-1]  # differs at the last but one
        blocks.append((near, short))
    return tuple(blocks)


def with_hostile_tags(calls: list[ReplayCall], text: str, kind: str) -> list[ReplayCall]:
    """Each run gets grammar ``run index mod (MAX_GRAMMARS - 1)``: every live request of a
    full batch of 64 has its own."""
    runs: dict[str, int] = {}
    out = []
    for c in calls:
        g = runs.setdefault(c.run_id, len(runs)) % (MAX_GRAMMARS - 1)
        tags = c.tags or StructureTags(agent_id=f"agent-{c.run_id}", query_id=c.run_id)
        blocks = (space_blocks if kind == "spaces" else hostile_blocks)(text, g)
        out.append(replace(c, tags=tags.model_copy(update={"blocks": blocks})))
    return out


def step_times(calls: list[ReplayCall], setup, batch: int, k: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Per-step proposer time (us) over the steps with ``batch`` calls in flight."""
    # one scope may take every grammar row (the default lets one scope hold 16 of 63):
    # the worst a deployment allows
    proposer = make_proposer("agentspec", setup.env, blocks_max_per_scope=MAX_GRAMMARS)
    r = replay_workload(calls, proposer, batch=batch, k=k, cost_model=setup.cost)
    return np.asarray(r.propose_us)[np.asarray(r.step_batch) >= batch]


def main() -> None:
    ap = replay_parser(__doc__, proposers="agentspec")
    ap.set_defaults(batch=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-calls", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--kind",
        choices=("windows", "spaces"),
        default="windows",
        help="windows: near misses of the text's own 63-byte windows; spaces: runs of "
        "spaces with one other byte (indentation compares every delimiter deeply)",
    )
    args = ap.parse_args()
    setup = load_workloads(args.traces, args.tokenizer, max_k=args.k, max_calls=args.max_calls)
    tb = setup.env.token_bytes
    assert tb is not None
    print(f"{'workload':>22} {'full steps':>10} {'benign ms':>10} {'hostile ms':>11} {'ratio':>6}")
    for wl, calls in setup.workloads.items():
        text = b"".join(tb[t] for c in calls[:200] for t in c.output.tolist()).decode(
            "utf-8", errors="ignore"
        )
        hostile = with_hostile_tags(list(calls), text, args.kind)
        med = {"benign": [], "hostile": []}
        n_steps = 0
        t0 = time.perf_counter()
        for _ in range(args.repeats):  # interleaved, so drift hits both alike
            for name, cs in (("benign", list(calls)), ("hostile", hostile)):
                us = step_times(cs, setup, args.batch, args.k)
                if len(us) == 0:
                    break
                n_steps = len(us)
                med[name].append(float(np.median(us)) / 1e3)
        if not med["hostile"]:
            print(f"{wl:>22}  never {args.batch} calls in flight: skipped")
            continue
        b, h = float(np.median(med["benign"])), float(np.median(med["hostile"]))
        print(
            f"{wl:>22} {n_steps:>10} {b:>10.3f} {h:>11.3f} {h / b:>6.2f}"
            f"   (medians of {args.repeats}: benign {[round(x, 3) for x in med['benign']]}, "
            f"hostile {[round(x, 3) for x in med['hostile']]}; {time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
