"""Not a benchmark: the proposer ``oracle_ceiling.py`` runs inside the embedded engine.

One proposer, four modes (:attr:`OracleProposer.mode`, set by the script between passes,
the engine running in the script's process):

* ``"off"``: no drafts (the baseline: the same speculative engine, every draft empty);
* ``"oracle"``: each request's own greedy output, known from an earlier pass over the same
  prompts (:attr:`OracleProposer.memory`, prompt digest -> output), up to ``k`` tokens from
  the request's position — every draft token is accepted, the ceiling of linear drafts;
* ``"agentspec"``: AgentSpec's drafts (the proposer built with the engine's environment, so
  its budget reads the engine's measured cost model);
* ``"trim"``: AgentSpec's drafts cut where they leave the known output (their accepted
  prefix): the same accepted tokens without the rejected ones — a perfect length choice.
  Where the output is not known (a request past the recorded tokens, which lack the last
  step's), the draft is dropped: a rejected token is never drafted in this mode.

In every mode each request's tokens are recorded (at ``stop``). AgentSpec sees the requests
of its own modes only (``agentspec``, ``trim``), as its engine in ``agentspec bench`` sees
its own runs; the passes without its drafts leave it untouched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentspec_mw.agentspec.proposer import AgentSpecProposer
from agentspec_mw.proposer import Draft, ProposerEnv, StepContext
from agentspec_mw.replay.sim import accepted_length

MODES = ("off", "oracle", "agentspec", "trim")
_AGENTSPEC_MODES = ("agentspec", "trim")


def _digest(prompt: Any) -> str:
    data = np.ascontiguousarray(np.asarray(prompt, dtype=np.int32)).tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class OracleProposer:
    """See the module docstring."""

    name = "oracle"
    mode: ClassVar[str] = "off"
    memory: ClassVar[dict[str, list[int]]] = {}
    """Prompt digest -> the longest output seen for it (the last step's tokens are not
    fed to a proposer, so a pass records all but a request's final token(s))."""

    def __init__(self, env: ProposerEnv | None = None, **options: Any) -> None:
        self.inner = AgentSpecProposer(env=env, **options)
        self._reqs: dict[str, tuple[str, list[int], bool]] = {}  # digest, tokens, inner sees

    def start(self, req_id: str, prompt_ids: Any, tags: Any = None) -> None:
        inner = self.mode in _AGENTSPEC_MODES
        self._reqs[req_id] = (_digest(prompt_ids), [], inner)
        if inner:
            self.inner.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: Any) -> None:
        _, seen, inner = self._reqs[req_id]
        seen.extend(int(t) for t in token_ids)
        if inner:
            self.inner.extend(req_id, token_ids)

    def _known(self, req_id: str) -> tuple[list[int], int] | None:
        """The recorded output of the request's prompt and its position in it, if its tokens
        so far are that output's start."""
        key, seen, _ = self._reqs[req_id]
        known = self.memory.get(key)
        n = len(seen)
        if known is None or len(known) <= n or known[:n] != seen:
            return None
        return known, n

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        if self.mode in _AGENTSPEC_MODES:
            drafts = list(self.inner.propose(req_ids, k, step))
            if self.mode == "agentspec":
                return drafts
            for i, (rid, d) in enumerate(zip(req_ids, drafts, strict=True)):
                if not len(d):
                    continue
                at = self._known(rid)
                if at is None:  # no recorded output to cut at (past its end, or another
                    drafts[i] = Draft(())  # output): its accepted prefix is not known
                    continue
                known, n = at
                cut = accepted_length(d.token_ids, np.asarray(known[n:]))
                drafts[i] = Draft(d.token_ids[:cut], d.probs[:cut])
            return drafts
        out = [Draft(())] * len(req_ids)
        if self.mode != "oracle":
            return out
        for i, rid in enumerate(req_ids):
            at = self._known(rid)
            if at is not None:
                known, n = at
                out[i] = Draft(tuple(known[n : n + k]))
        return out

    def stop(self, req_id: str) -> None:
        key, seen, inner = self._reqs.pop(req_id, ("", [], False))
        if key and len(seen) > len(self.memory.get(key, ())):
            self.memory[key] = seen
        if inner:
            self.inner.stop(req_id)
