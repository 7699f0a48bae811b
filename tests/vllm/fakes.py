"""Proposers for the adapter tests: a recording probe, a scripted drafter, a thrower.

They are importable by dotted path (``tests.vllm.fakes.ProbeProposer``) so the real engine
can load them through the adapter too.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Sequence
from typing import Any

from agentspec_mw.proposer import Draft, StepContext, TokenIds
from agentspec_mw.tags import StructureTags

#: What every ProbeProposer in this process saw (the engine builds its own instance).
PROBE_LOG: list[tuple[str, Any]] = []
_LOCK = threading.Lock()


class ProbeProposer:
    """Records every verb call; drafts by n-gram-free *echo*: repeats the last token.

    With ``inner`` (a builtin proposer name) it drafts with that proposer instead, so the
    real engine verifies real drafts. If any request in a ``propose`` batch carries the tag
    ``agent_id == "explode"`` it raises, to test fault isolation.
    """

    name = "probe"

    def __init__(self, env: Any = None, inner: str | None = None, draft_len: int = 3) -> None:
        self.draft_len = draft_len
        self.tags: dict[str, StructureTags | None] = {}
        self.tokens: dict[str, list[int]] = {}
        self.inner: Any = None
        if inner is not None:
            from agentspec_mw.registry import make_proposer

            self.inner = make_proposer(inner, env)

    def _log(self, event: str, payload: Any) -> None:
        with _LOCK:
            PROBE_LOG.append((event, payload))

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        self.tags[req_id] = tags
        self.tokens[req_id] = [int(t) for t in prompt_ids]
        self._log("start", (req_id, tags, len(prompt_ids)))
        if self.inner is not None:
            self.inner.start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.tokens[req_id].extend(int(t) for t in token_ids)
        self._log("extend", (req_id, [int(t) for t in token_ids]))
        if self.inner is not None:
            self.inner.extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        self._log("propose", (list(req_ids), k, step))
        for rid in req_ids:
            tags = self.tags.get(rid)
            if tags is not None and tags.agent_id == "explode":
                raise RuntimeError("probe: injected fault")
        if self.inner is not None:
            drafts: list[Draft] = self.inner.propose(req_ids, k, step)
            return drafts
        return [Draft((self.tokens[rid][-1],) * self.draft_len) for rid in req_ids]

    def stop(self, req_id: str) -> None:
        self._log("stop", req_id)
        self.tags.pop(req_id, None)
        self.tokens.pop(req_id, None)
        if self.inner is not None:
            self.inner.stop(req_id)


class GreedyLongProposer(ProbeProposer):
    """Always proposes far more than ``k`` tokens (the adapter must cut them)."""

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [Draft(tuple(range(1, 4 * k + 1))) for _ in req_ids]


class ExplodingProposer(ProbeProposer):
    """Raises in the verb named by ``fail_in`` (start, extend, propose, stop)."""

    def __init__(self, env: Any = None, fail_in: str = "propose") -> None:
        super().__init__(env)
        self.fail_in = fail_in

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        if self.fail_in == "start":
            raise KeyError("boom-start")
        super().start(req_id, prompt_ids, tags)

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        if self.fail_in == "extend":
            raise ValueError("boom-extend")
        super().extend(req_id, token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        if self.fail_in == "propose":
            raise RuntimeError("boom-propose")
        return super().propose(req_ids, k, step)

    def stop(self, req_id: str) -> None:
        if self.fail_in == "stop":
            raise RuntimeError("boom-stop")
        super().stop(req_id)


class BadDraftProposer(ProbeProposer):
    """Drafts like :class:`ProbeProposer`, but rows of requests tagged
    ``agent_id == "bad"`` (every row with ``all_rows``) lead with the token ``bad`` —
    10**6 by default, far outside any vocabulary (the adapter must drop those rows)."""

    def __init__(
        self, env: Any = None, bad: Any = 10**6, all_rows: bool = False, inner: str | None = None
    ) -> None:
        super().__init__(env, inner=inner)
        self.bad = bad
        self.all_rows = all_rows

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        drafts = super().propose(req_ids, k, step)
        out = []
        for rid, d in zip(req_ids, drafts, strict=True):
            tags = self.tags.get(rid)
            if self.all_rows or (tags is not None and tags.agent_id == "bad"):
                d = Draft((self.bad, *d.token_ids[: k - 1]))
            out.append(d)
        return out


class BatchExtendProbe(ProbeProposer):
    """A :class:`ProbeProposer` that also takes a step's tokens in one ``extend_many``
    (recorded in ``batches``; ``single_extends`` counts the calls of
    ``extend``); all or nothing, it raises ``ValueError`` when a request
    tagged ``agent_id == "bad"`` is in the batch, and that request's own ``extend`` raises
    too (the session must then lose only it)."""

    def __init__(self, env: Any = None, draft_len: int = 3) -> None:
        super().__init__(env, draft_len=draft_len)
        self.batches: list[list[tuple[str, list[int]]]] = []
        self.single_extends = 0

    def _bad(self, req_id: str) -> bool:
        tags = self.tags.get(req_id)
        return tags is not None and tags.agent_id == "bad"

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.single_extends += 1
        if self._bad(req_id):
            raise ValueError("probe: bad request")
        super().extend(req_id, token_ids)

    def extend_many(self, req_ids: Sequence[str], token_ids: Any, lens: Any) -> None:
        if any(map(self._bad, req_ids)):
            raise ValueError("probe: a bad request in the batch")
        rows, a = [], 0
        for rid, n in zip(req_ids, lens, strict=True):
            rows.append((rid, [int(t) for t in token_ids[a : a + n]]))
            a += n
        self.batches.append(rows)
        for rid, toks in rows:
            ProbeProposer.extend(self, rid, toks)


class OpenAIWorker(http.server.BaseHTTPRequestHandler):
    """An OpenAI-shaped worker for vllm-router: answers health checks (a model list), and
    completions with its own port."""

    def do_GET(self) -> None:
        self._reply({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._reply({"port": self.server.server_address[1]})

    def _reply(self, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass
