"""Not a benchmark: the proposer ``oracle_ceiling.py`` runs inside the embedded engine.

One proposer, three modes (:attr:`OracleProposer.mode`, set by the script between passes,
the engine running in the script's process):

* ``"off"``: no drafts (the baseline: the same speculative engine, every draft empty);
* ``"oracle"``: each request's own greedy output, known from an earlier pass over the same
  prompts (:attr:`OracleProposer.memory`, prompt digest -> output), up to ``k`` tokens from
  the request's position — every draft token is accepted, the ceiling of linear drafts;
* ``"agentspec"``: AgentSpec's drafts (the proposer built with the engine's environment, so
  its budget reads the engine's measured cost model).

In every mode each request's tokens are recorded (at ``stop``) and AgentSpec sees every
``start``/``extend``/``stop``, as it would serving the same traffic; it drafts only in
its own mode.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentspec_mw.agentspec.proposer import AgentSpecProposer
from agentspec_mw.proposer import Draft, ProposerEnv, StepContext

MODES = ("off", "oracle", "agentspec")


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
        self._reqs: dict[str, tuple[str, list[int]]] = {}

    def start(self, req_id: str, prompt_ids: Any, tags: Any = None) -> None:
        self._reqs[req_id] = (_digest(prompt_ids), [])
        self.inner.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: Any) -> None:
        self._reqs[req_id][1].extend(int(t) for t in token_ids)
        self.inner.extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        if self.mode == "agentspec":
            return self.inner.propose(req_ids, k, step)
        out = [Draft(())] * len(req_ids)
        if self.mode != "oracle":
            return out
        for i, rid in enumerate(req_ids):
            key, seen = self._reqs[rid]
            known = self.memory.get(key)
            n = len(seen)
            if known is not None and len(known) > n and known[:n] == seen:
                out[i] = Draft(tuple(known[n : n + k]))
        return out

    def stop(self, req_id: str) -> None:
        key, seen = self._reqs.pop(req_id, ("", []))
        if key and len(seen) > len(self.memory.get(key, ())):
            self.memory[key] = seen
        self.inner.stop(req_id)
