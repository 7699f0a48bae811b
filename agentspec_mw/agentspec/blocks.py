"""Block tracking: which kind of block (code, tool call, thought, ...) a request is in.

A :class:`BlockGrammar` is compiled once per delimiter set and token table; a
:class:`BlockState` per request follows the emitted bytes through the delimiters with a
small pushdown automaton (a stack of open blocks):

* a start delimiter pushes its block; the matching end delimiter pops it (for blocks whose
  start and end are the same, e.g. fenced code, a second occurrence closes);
* delimiters may be split across tokens (a rolling tail of the last bytes is kept);
* nesting is capped (:data:`MAX_DEPTH`); an unterminated block stays open until the request
  stops;
* a token is attributed to the block that was open *before* it: an opening delimiter
  belongs to the outer block, a closing one to the block it closes.

Per token there is no tokenizer call and, on the fast path, no Python work per token:
every delimiter starts with an *anchor* byte (```` ` ````, ``<``, ``{``, newline for the
defaults); the grammar precomputes which token ids contain an anchor, and tokens are
scanned one by one only while an anchor is among the new tokens or the last
``max_len`` bytes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_BLOCKS", "MAX_DEPTH", "BlockGrammar", "BlockSpec", "BlockState", "ROOT"]

ROOT = "text"
MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """A block kind and its delimiters (matched on UTF-8 bytes)."""

    name: str
    start: str
    end: str


#: Delimiters of common agent output formats. ReAct labels are line blocks: they open at a
#: line start and close at the end of the line.
DEFAULT_BLOCKS: tuple[BlockSpec, ...] = (
    BlockSpec("code", "```", "```"),
    BlockSpec("tool_call", "<tool_call>", "</tool_call>"),
    BlockSpec("think", "<think>", "</think>"),
    BlockSpec("json_call", '{"name"', "\n"),
    BlockSpec("thought", "\nThought", "\n"),
    BlockSpec("action", "\nAction", "\n"),
    BlockSpec("observation", "\nObservation", "\n"),
)


class BlockGrammar:
    """Compiled delimiters for one token table (shared by all requests that use them)."""

    def __init__(self, specs: Sequence[BlockSpec], token_bytes: Sequence[bytes]) -> None:
        if not specs:
            raise ValueError("a block grammar needs at least one BlockSpec")
        self.specs = tuple(specs)
        self.token_bytes = token_bytes
        self._starts = [(s.start.encode(), s.name) for s in specs]
        self._ends = {s.name: s.end.encode() for s in specs}
        self.max_len = max(max(len(s.start.encode()), len(s.end.encode())) for s in specs)
        delims = sorted(
            {d for d, _ in self._starts} | set(self._ends.values()), key=len, reverse=True
        )
        # role of each delimiter: the blocks it starts (a name) and/or an end (None)
        self._roles: dict[bytes, list[str | None]] = {d: [] for d in delims}
        for d, name in self._starts:
            self._roles[d].append(name)
        for d in set(self._ends.values()):
            self._roles[d].append(None)
        self._prefixes = {d: [p for p in delims if d.startswith(p)] for d in delims}
        self._pattern = re.compile(b"(?=(" + b"|".join(re.escape(d) for d in delims) + b"))")
        self.anchors = bytes(
            sorted({d[0] for d, _ in self._starts} | {e[0] for e in self._ends.values()})
        )
        trig = np.zeros(max(len(token_bytes), 1), dtype=np.bool_)
        for tid, tb in enumerate(token_bytes):
            if tb and any(b in self.anchors for b in tb):
                trig[tid] = True
        self.trigger = trig
        self.trigger_ids = frozenset(np.flatnonzero(trig).tolist())

    def _events(self, tail: bytes, new_from: int) -> list[tuple[int, bytes, str | None]]:
        """Delimiters ending after ``new_from`` in ``tail``: (end pos, delim, start-of).

        One regex scan finds every position where a delimiter begins (a lookahead, so
        overlapping delimiters such as ``\n`` and ``\nThought`` are both seen).
        """
        found: list[tuple[int, bytes, str | None]] = []
        start = max(0, new_from - self.max_len + 1)
        for m in self._pattern.finditer(tail, start):
            pos = m.start()
            for delim in self._prefixes[m.group(1)]:
                end = pos + len(delim)
                if end <= new_from or not tail.startswith(delim, pos):
                    continue
                for start_of in self._roles[delim]:
                    found.append((end, delim, start_of))
        found.sort(key=lambda e: e[0])
        return found


class BlockState:
    """One request's position in the block structure."""

    __slots__ = ("grammar", "stack", "tail")

    def __init__(self, grammar: BlockGrammar) -> None:
        self.grammar = grammar
        self.stack: list[str] = []
        self.tail = b""

    @property
    def current(self) -> str:
        """The innermost open block (``"text"`` at top level)."""
        return self.stack[-1] if self.stack else ROOT

    def _apply(
        self, delim: bytes, start_of: str | None, done: set[tuple[int, bytes]], end: int
    ) -> None:
        if (end, delim) in done:
            return  # one occurrence is one event (e.g. ``` closes, it does not reopen)
        top = self.stack[-1] if self.stack else None
        if top is not None and delim == self.grammar._ends[top]:
            self.stack.pop()
            done.add((end, delim))
        elif start_of is not None and len(self.stack) < MAX_DEPTH:
            self.stack.append(start_of)
            done.add((end, delim))

    def feed(self, token_ids: Sequence[int] | np.ndarray) -> list[tuple[str, int]]:
        """Advance over tokens; return runs ``(block, n_tokens)`` attributing each token."""
        g = self.grammar
        ids = token_ids.tolist() if isinstance(token_ids, np.ndarray) else list(token_ids)
        n = len(ids)
        if n == 0:
            return []
        table = g.token_bytes
        size = len(table)
        pieces = [table[t] if 0 <= t < size else b"" for t in ids]
        data = self.tail + b"".join(pieces)
        trig = g.trigger_ids
        if not any(t in trig for t in ids) and not any(a in self.tail for a in g.anchors):
            self.tail = data[-g.max_len :]  # fast path: no delimiter can complete
            return [(self.current, n)]
        events = g._events(data, len(self.tail))
        if not events:  # an anchor byte, but no delimiter completes: still one run
            self.tail = data[-g.max_len :]
            return [(self.current, n)]
        runs: list[tuple[str, int]] = []
        done: set[tuple[int, bytes]] = set()
        pos = len(self.tail)
        ev = 0
        for piece in pieces:
            block = self.current
            if runs and runs[-1][0] == block:
                runs[-1] = (block, runs[-1][1] + 1)
            else:
                runs.append((block, 1))
            pos += len(piece)
            while ev < len(events) and events[ev][0] <= pos:
                end, delim, start_of = events[ev]
                self._apply(delim, start_of, done, end)
                ev += 1
        self.tail = data[-g.max_len :]
        return runs
