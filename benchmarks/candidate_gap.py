"""Where AgentSpec's accepted tokens are lost: candidates, picking, or the budget's cut.

Replays one trace with AgentSpec driving the schedule and SuffixDecoding as a shadow (it
sees the same ``start``/``extend``/``stop`` calls and drafts on the same steps; its drafts
are only scored). Per agent and in all, per call-step, it prints the tokens each would
have accepted against the recorded output:

* ``suffix`` — SuffixDecoding's draft;
* ``iso`` / ``agent`` / ``scope`` / ``local`` — each AgentSpec source's whole candidate (up to k);
* ``best`` — the best of the three (an oracle that knows the output);
* ``picked`` — the candidate AgentSpec chose, whole;
* ``drafted`` / ``accepted`` — what the budget let through, and what of it was accepted.

``picked`` vs ``accepted`` is what the budget (the cost model) gives up; ``best`` vs
``picked`` what the choice between sources does; ``picked`` vs ``suffix`` compares the
candidates themselves. No timing is involved.

    python benchmarks/candidate_gap.py --trace ../shared/traces/chatdev_multi_agent.jsonl.xz \\
        --tokenizer ../shared/tokenizers/qwen2.5 --batch 256 --k 16
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from _replay_setup import load_workloads

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.cli import _parse_set
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import accepted_length, replay_workload
from agentspec_mw.tags import StructureTags

COLUMNS = ("suffix", *SOURCES, "best", "picked", "drafted", "accepted")


class Shadowed:
    """AgentSpec (drafts, schedule) with SuffixDecoding beside it; scores both per step."""

    name = "agentspec"

    def __init__(
        self, agentspec: AgentSpecProposer, suffix: Any, outputs: dict, agents: dict
    ) -> None:  # type: ignore[type-arg]
        self.a, self.s = agentspec, suffix
        self.a.candidates = {}
        self.outputs, self.agents = outputs, agents
        self.pos: dict[str, int] = {}
        self.sums: collections.defaultdict[str, np.ndarray] = collections.defaultdict(
            lambda: np.zeros(1 + len(COLUMNS))
        )

    def start(self, req_id: str, prompt: Any, tags: StructureTags | None = None) -> None:
        self.a.start(req_id, prompt, tags)
        self.s.start(req_id, prompt, tags)
        self.pos[req_id] = 0

    def extend(self, req_id: str, ids: Any) -> None:
        self.a.extend(req_id, ids)
        self.s.extend(req_id, ids)
        self.pos[req_id] += len(ids)

    def stop(self, req_id: str) -> None:
        self.a.stop(req_id)
        self.s.stop(req_id)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        cands = dict(self.a.candidates or {})
        shadow = self.s.propose(req_ids, k, step)
        n = len(req_ids)
        for i, r in enumerate(req_ids):
            truth = self.outputs[r][self.pos[r] :]
            v = np.zeros(1 + len(COLUMNS))
            v[0] = 1  # call-steps
            v[1] = accepted_length(shadow[i].token_ids, truth)
            if cands:
                tok, lens = cands["tok"], cands["lens"]
                for src in range(len(SOURCES)):
                    row = src * n + i
                    v[2 + src] = accepted_length(tok[row, : lens[row]], truth)
                v[2 + len(SOURCES)] = v[2 : 2 + len(SOURCES)].max()
                p = cands["pick"][i]
                v[3 + len(SOURCES)] = accepted_length(tok[p, : lens[p]], truth)
            v[4 + len(SOURCES)] = len(drafts[i].token_ids)
            v[5 + len(SOURCES)] = accepted_length(drafts[i].token_ids, truth)
            self.sums[self.agents[r]] += v
        return drafts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--max-calls-per-run", type=int, default=None)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="agentspec.OPTION=VALUE",
        help="AgentSpec option as in agentspec replay, e.g. agentspec.index_walk_batch=null",
    )
    args = ap.parse_args(argv)
    opts = _parse_set(args.set).get("agentspec", {})
    setup = load_workloads(
        [args.trace], args.tokenizer, max_k=args.k, max_calls_per_run=args.max_calls_per_run
    )
    ((workload, calls),) = setup.workloads.items()
    env, cost = setup.env, setup.cost
    outputs = {c.req_id: c.output for c in calls}
    agents = {c.req_id: (c.tags.agent_id if c.tags else "(untagged)") for c in calls}
    agentspec = make_proposer("agentspec", env, **opts)
    assert isinstance(agentspec, AgentSpecProposer)
    shadow = Shadowed(agentspec, make_proposer("suffix", env), outputs, agents)
    replay_workload(calls, shadow, batch=args.batch, k=args.k, cost_model=cost)
    print(
        f"\n{workload}, batch {args.batch}, k = {args.k}, options {opts or '{}'}: "
        "tokens per call-step\n"
    )
    print("| agent | call-steps | " + " | ".join(COLUMNS) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |")
    total = np.zeros(1 + len(COLUMNS))
    for agent, v in sorted(shadow.sums.items()):
        total += v
        print(f"| {agent} | {int(v[0])} | " + " | ".join(f"{x / v[0]:.3f}" for x in v[1:]) + " |")
    print(
        f"| all | {int(total[0])} | " + " | ".join(f"{x / total[0]:.3f}" for x in total[1:]) + " |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
