"""Where AgentSpec's accepted tokens are lost: candidates, picking, or the budget's cut.

Replays one trace with AgentSpec driving the schedule and SuffixDecoding as a shadow (it
sees the same ``start``/``extend``/``stop`` calls and drafts on the same steps; its drafts
are only scored). Per agent and in all, per call-step, it prints the tokens each would
have accepted against the recorded output:

* ``suffix`` — SuffixDecoding's draft;
* ``iso`` / ``agent`` / ``scope`` / ``local`` — each AgentSpec source's whole candidate (up to k);
* ``best`` — the best of the four (an oracle that knows the output);
* ``picked`` — the candidate AgentSpec chose, whole;
* ``drafted`` / ``accepted`` — what the budget let through, and what of it was accepted.

``picked`` vs ``accepted`` is what the budget (the cost model) gives up; ``best`` vs
``picked`` what the choice between sources does; ``picked`` vs ``suffix`` compares the
candidates themselves. No timing is involved.

Then, per agent and block kind, the tokens SuffixDecoding's draft had accepted beyond
AgentSpec's on the same call-step (``s`` = suffix's, ``a`` = AgentSpec's accepted, ``p``
= its picked candidate's, ``b`` = its best source's; ``a <= p <= b``), split exactly into

* ``budget`` — ``min(p, s) - a``: the picked candidate had them, the budget cut them;
  ``bound`` the part under the admission bound (survival too low to ever pay), ``alloc``
  the rest (left out by the step's allocation);
* ``choice`` — ``min(b, s) - min(p, s)``: another source had them (a table names the
  picked source and the first that had more);
* ``no cand`` — ``s - b`` where ``b = 0``: no source's candidate had even one of them;
  ``short`` — ``s - b`` where ``b > 0``: the best candidate stopped or went wrong sooner;

and the tokens AgentSpec accepted beyond SuffixDecoding's draft (``gain``). For the
candidate part (``s > b``), ``where`` says where SuffixDecoding's accepted tokens, with
the two context tokens before them, already stood at that step: the request's own prompt
or output (``own``), a member of its fan-out group (``sibling``), an earlier call of the
same agent in the same query (``repeat``), another agent of the same query (``query``),
the same agent in another query (``agent``), another agent of another query (``other``),
or, failing all of these, the same after only one context token (``own/1`` …), else
nowhere as a whole (``none``). Last, the
picked candidate's positions: at or above the admission bound, their mean survival against
how often the output confirmed them, drafted and cut; under it, the mean bound and the
same confirmation rate.

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
from _replay_setup import Observed, load_workloads

from agentspec_mw.agentspec import SOURCES, AgentSpecProposer
from agentspec_mw.agentspec.budget import admission_bound, step_shape
from agentspec_mw.cli import _parse_set
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.sim import ReplayCall, accepted_length, replay_workload
from agentspec_mw.tags import StructureTags

COLUMNS = ("suffix", *SOURCES, "best", "picked", "drafted", "accepted")
LOSS = ("suffix", "accepted", "gain", "loss", "bound", "alloc", "choice", "no cand", "short")
_PLACES = ("own", "sibling", "repeat", "query", "agent", "other")
WHERE = (*_PLACES, *(f"{w}/1" for w in _PLACES), "none")
ANCHOR = 2  # context tokens before the accepted ones (the index's shortest match)


def _contains(hay: bytes, needle: bytes) -> bool:
    """Whether int32 ``needle`` occurs in int32 ``hay`` at a token boundary."""
    at = hay.find(needle)
    while at >= 0:
        if at % 4 == 0:
            return True
        at = hay.find(needle, at + 1)
    return False


class Shadowed(Observed):
    """AgentSpec (drafts, schedule) with SuffixDecoding beside it; scores both per step."""

    def __init__(self, agentspec: AgentSpecProposer, suffix: Any, calls: Sequence[ReplayCall]):
        super().__init__(agentspec, suffix)
        self.s = suffix
        self.calls = {c.req_id: c for c in calls}
        self.outputs = {c.req_id: c.output for c in calls}
        self.agents = {c.req_id: str(c.tags.agent_id if c.tags else "(untagged)") for c in calls}
        self.started: list[str] = []  # every request started so far, in order
        self.sums: collections.defaultdict[str, np.ndarray] = collections.defaultdict(
            lambda: np.zeros(1 + len(COLUMNS))
        )
        self.loss: collections.defaultdict[tuple[str, str], np.ndarray] = collections.defaultdict(
            lambda: np.zeros(1 + len(LOSS))
        )
        self.where: collections.defaultdict[str, np.ndarray] = collections.defaultdict(
            lambda: np.zeros(len(WHERE))
        )
        # the choice part by agent and (picked source, the first source that had more)
        self.choice: collections.Counter[tuple[str, str]] = collections.Counter()
        # survival calibration of the picked candidate's positions: [drafted, cut,
        # under the bound] x [positions, sum of survivals (of the bound for the last),
        # confirmed by the output]
        self.surv = np.zeros((3, 3))

    def start(self, req_id: str, prompt: Any, tags: StructureTags | None = None) -> None:
        super().start(req_id, prompt, tags)
        self.started.append(req_id)

    def _text(self, rid: str) -> np.ndarray:
        """What request ``rid`` produced so far."""
        return self.outputs[rid][: self.pos[rid]]

    def _where(self, rid: str, needle: np.ndarray) -> str:
        """Where ``needle`` (context anchor + accepted tokens) stood at this step."""
        me = self.calls[rid]
        key = needle.astype(np.int32).tobytes()
        own = np.concatenate([me.prompt, self._text(rid)]).astype(np.int32).tobytes()
        if _contains(own, key):
            return "own"
        t = me.tags
        agent = t.agent_id if t else None
        group = t.group_id if t else None
        found: set[str] = set()
        for other in self.started:
            if other == rid or not self.pos[other]:
                continue
            o = self.calls[other]
            if not _contains(self._text(other).astype(np.int32).tobytes(), key):
                continue
            ot = o.tags
            same_agent = agent is not None and ot is not None and ot.agent_id == agent
            if o.run_id == me.run_id:
                if group is not None and ot is not None and ot.group_id == group:
                    found.add("sibling")
                elif same_agent:
                    found.add("repeat")
                else:
                    found.add("query")
            else:
                found.add("agent" if same_agent else "other")
        return next((w for w in _PLACES if w in found), "none")

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = self.a.propose(req_ids, k, step)
        cands = dict(self.a.candidates or {})
        shadow = self.s.propose(req_ids, k, step)
        n = len(req_ids)
        flat = n_ok = None
        bound = 0.0
        if cands:  # the picked rows' admitted survivals (diagnostic read of the workspace)
            ws = self.a._ws.get(n, max(k, 1))
            n_ok = ws.n_ok.copy()
            flat = ws.flat[: int(n_ok.sum())].copy()
            bound = admission_bound(self.a.cost, step_shape(step))
        offset = 0
        for i, r in enumerate(req_ids):
            truth = self.outputs[r][self.pos[r] :]
            v = np.zeros(1 + len(COLUMNS))
            v[0] = 1  # call-steps
            s = v[1] = accepted_length(shadow[i].token_ids, truth)
            if cands:
                tok, lens = cands["tok"], cands["lens"]
                for src in range(len(SOURCES)):
                    row = src * n + i
                    v[2 + src] = accepted_length(tok[row, : lens[row]], truth)
                v[2 + len(SOURCES)] = v[2 : 2 + len(SOURCES)].max()
                pk = cands["pick"][i]
                v[3 + len(SOURCES)] = accepted_length(tok[pk, : lens[pk]], truth)
            d = v[4 + len(SOURCES)] = len(drafts[i].token_ids)
            a = v[5 + len(SOURCES)] = accepted_length(drafts[i].token_ids, truth)
            b, p = v[2 + len(SOURCES)], v[3 + len(SOURCES)]
            agent = self.agents[r]
            self.sums[agent] += v
            ok = 0
            if n_ok is not None and flat is not None:
                ok = int(n_ok[i])
                for j in range(ok):
                    cut = int(j >= d)
                    self.surv[cut] += (1, flat[offset + j], j < p)
                offset += ok
                pk = cands["pick"][i]
                for j in range(ok, int(cands["lens"][pk])):
                    self.surv[2] += (1, bound, j < p)
            w = np.zeros(1 + len(LOSS))
            w[0], w[1], w[2], w[3] = 1, s, a, max(0.0, a - s)
            if s > a:
                w[4] = s - a
                budget = min(p, s) - a  # positions [d, min(p, s)): a = d here
                w[5] = max(0.0, min(p, s) - max(d, ok))  # at or past the bound's last
                w[6] = budget - w[5]
                w[7] = min(b, s) - min(p, s)
                if w[7] > 0:
                    got = v[2 : 2 + len(SOURCES)]
                    better = SOURCES[int(np.argmax(got > p))]
                    self.choice[(agent, f"{SOURCES[cands['pick'][i] // n]} -> {better}")] += w[7]
                w[8 if b == 0 else 9] = s - min(b, s)
                if s > b:
                    m = self.pos[r]
                    ctx = np.concatenate([self.calls[r].prompt, self.outputs[r][:m]])
                    where = "none"
                    for anchor in (ANCHOR, 1):  # then a 1-token match (SuffixDecoding's least)
                        needle = np.concatenate([ctx[-anchor:], truth[: int(s)]])
                        where = self._where(r, needle)
                        if where != "none":
                            where += "" if anchor == ANCHOR else "/1"
                            break
                    self.where[agent][WHERE.index(where)] += s - b
            block = self.a.block_of(r) or "?"
            self.loss[(agent, block)] += w
        return drafts


def _rows(title: str, head: Sequence[str], rows: dict[Any, np.ndarray]) -> None:
    """A markdown table of summed counts, one row per key and the total."""
    print(f"\n{title}\n")
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join("---" for _ in head) + " |")
    total = np.sum(list(rows.values()), axis=0)
    for key, v in [*sorted(rows.items()), ("all", total)]:
        label = " / ".join(key) if isinstance(key, tuple) else str(key)
        print(f"| {label} | " + " | ".join(f"{x:,.0f}" for x in v) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--cost-model", default="llama8b-h100", help="as in agentspec replay")
    ap.add_argument("--tags", choices=("trace", "none"), default="trace")
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
        [args.trace],
        args.tokenizer,
        max_k=args.k,
        cost_model=args.cost_model,
        max_calls_per_run=args.max_calls_per_run,
        tags=args.tags,
    )
    ((workload, calls),) = setup.workloads.items()
    env, cost = setup.env, setup.cost
    agentspec = make_proposer("agentspec", env, **opts)
    assert isinstance(agentspec, AgentSpecProposer)
    shadow = Shadowed(agentspec, make_proposer("suffix", env), calls)
    replay_workload(calls, shadow, batch=args.batch, k=args.k, cost_model=cost)
    print(
        f"\n{workload}, batch {args.batch}, k = {args.k}, {args.cost_model}, tags "
        f"{args.tags}, options {opts or '{}'}"
    )
    _rows("Tokens, summed over call-steps", ("agent", "call-steps", *COLUMNS), shadow.sums)
    for a, v in sorted(shadow.sums.items()):  # the per-step averages of the table above
        print(
            f"  {a}: "
            + ", ".join(f"{c} {x / v[0]:.3f}" for c, x in zip(COLUMNS, v[1:], strict=True))
        )
    _rows(
        "Tokens SuffixDecoding had accepted beyond AgentSpec (loss), and the reverse (gain)",
        ("agent / block", "call-steps", *LOSS),
        dict(shadow.loss),
    )
    _rows(
        "Where the candidate part (no cand + short) stood at its step",
        ("agent", *WHERE),
        dict(shadow.where),
    )
    print("\nThe choice part: picked source -> a source that had more\n")
    print("| agent | picked -> better | tokens |")
    print("| --- | --- | --- |")
    for (agent, move), x in sorted(shadow.choice.items()):
        print(f"| {agent} | {move} | {x:,.0f} |")
    print("\nPicked candidate's positions (under the bound: the bound, not the survival)\n")
    print("| | positions | mean survival | confirmed by the output |")
    print("| --- | --- | --- | --- |")
    names = ("drafted", "cut", "under the bound")
    for name, (cnt, surv, conf) in zip(names, shadow.surv, strict=True):
        if cnt:
            print(f"| {name} | {cnt:,.0f} | {surv / cnt:.3f} | {conf / cnt:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
