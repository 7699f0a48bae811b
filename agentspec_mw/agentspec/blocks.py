"""Block tracking: which kind of block (code, tool call, thought, ...) a request is in.

A :class:`BlockGrammar` is compiled once per delimiter set and token table into flat
arrays; a :class:`GrammarTable` holds several grammars as rows of one set of arrays, so
one kernel call advances requests of different grammars together (the grammar is a row
index, not a separate call). The state of one request is a small pushdown automaton (a
stack of open blocks and the last bytes seen) advanced by a numba kernel, :func:`feed`,
that the proposer calls for a whole batch inside its per-step kernel and
:class:`BlockState` calls for one request:

* a start delimiter pushes its block; the matching end delimiter pops it (for blocks whose
  start and end are the same, e.g. fenced code, a second occurrence closes);
* delimiters may be split across tokens (the automaton keeps rolling hashes of the last
  :data:`MAX_DELIM` bytes);
* nesting is capped (:data:`MAX_DEPTH`); an unterminated block stays open until the request
  stops;
* a token is attributed to the block that was open *before* it: an opening delimiter
  belongs to the outer block, a closing one to the block it closes;
* where several delimiters end at the same byte (``\\n`` and ``\\nThought``), the longer
  is applied first, and one occurrence of a delimiter is one event (a ```` ``` ```` that
  closes a code block does not reopen one).

Per token there is no tokenizer call: token bytes come from a flat table built once per
token table, and at each byte only the delimiters ending in that byte are checked, each
in constant time: the automaton keeps the 64-bit polynomial hash of every prefix of the
bytes it has seen (a ring of the last ``2 × MAX_DELIM``), so the hash of the last ``ln``
bytes is one multiply and one subtraction, compared with the delimiter's hash. A byte
therefore costs at most one check per delimiter of the grammar, whatever the delimiters'
lengths and however much of them the text repeats (byte-by-byte comparison cost up to
``64 × 64`` per byte under hostile delimiters). The hash base is drawn at random per
process (:data:`HASH_BASE`), so a client cannot craft delimiters that collide; a false
match has probability ``2^-64`` per check.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from agentspec_mw.agentspec.jit import kernel

__all__ = [
    "DEFAULT_BLOCKS",
    "MAX_DELIM",
    "MAX_DEPTH",
    "HASH_RING",
    "ROOT",
    "BlockGrammar",
    "BlockSpec",
    "BlockState",
    "GrammarTable",
    "current",
    "feed",
]

ROOT = "text"
MAX_DEPTH = 8
MAX_DELIM = 64
"""Longest delimiter, in UTF-8 bytes (a power of two: half the hash ring's size)."""
_RING = 2 * MAX_DELIM - 1  # mask of an automaton's ring of prefix hashes (>= MAX_DELIM + 1)
HASH_BASE = secrets.randbits(64) | 1
"""Base of the delimiters' polynomial hashes (odd, drawn per process)."""
_MASK = (1 << 64) - 1
_POW = np.array([pow(HASH_BASE, i, 1 << 64) for i in range(MAX_DELIM + 1)], dtype=np.uint64)
MAX_BLOCKS = 63
"""Block kinds per grammar (block id 0 is :data:`ROOT`)."""
HASH_RING = _RING + 1
"""Prefix hashes an automaton keeps (its ``tail`` row, uint64)."""
DEPTH, TAILN = 0, 1  # columns of an automaton's int64 state row (TAILN: bytes seen)


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

_FLAT_CACHE: dict[int, tuple[Sequence[bytes], np.ndarray, np.ndarray]] = {}


def _flat_bytes(token_bytes: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Token bytes as ``(offsets, data)`` arrays, built once per token table object."""
    hit = _FLAT_CACHE.get(id(token_bytes))
    if hit is not None and hit[0] is token_bytes:
        return hit[1], hit[2]
    lens = np.fromiter((len(b) for b in token_bytes), np.int64, len(token_bytes))
    off = np.zeros(len(token_bytes) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    data = np.frombuffer(b"".join(token_bytes) or b"\0", dtype=np.uint8).copy()
    _FLAT_CACHE[id(token_bytes)] = (token_bytes, off, data)  # keeps the table alive
    return off, data


def _delim_hashes(delims: Sequence[bytes]) -> np.ndarray:
    """The polynomial hash :func:`feed` computes over each delimiter's bytes (each
    byte counted as ``byte + 1``, the last byte with power 0), modulo 2^64: vectorised
    (numpy's uint64 arithmetic wraps), so a new grammar costs microseconds to hash."""
    lens = np.fromiter(map(len, delims), np.int64, len(delims))
    values = np.frombuffer(b"".join(delims), dtype=np.uint8).astype(np.uint64) + np.uint64(1)
    ends = np.cumsum(lens)
    owner = np.repeat(np.arange(len(delims)), lens)
    terms = values * _POW[ends[owner] - 1 - np.arange(len(values))]
    return np.add.reduceat(terms, ends - lens).astype(np.uint64)  # type: ignore[no-any-return]


class BlockGrammar:
    """Compiled delimiters for one token table (shared by all requests that use them).

    Block ids: 0 is :data:`ROOT`, ``i + 1`` is ``specs[i]``; :attr:`names` maps back.
    :attr:`arrays` is the tuple :func:`feed` takes.
    """

    def __init__(self, specs: Sequence[BlockSpec], token_bytes: Sequence[bytes]) -> None:
        if not specs:
            raise ValueError("a block grammar needs at least one BlockSpec")
        if len(specs) > MAX_BLOCKS:
            raise ValueError(f"a block grammar holds at most {MAX_BLOCKS} block kinds")
        self.specs = tuple(specs)
        self.token_bytes = token_bytes
        self.names: tuple[str, ...] = (ROOT, *(s.name for s in specs))
        delims: list[bytes] = []
        for s in specs:
            for d in (s.start.encode(), s.end.encode()):
                if not d or len(d) > MAX_DELIM:
                    raise ValueError(
                        f"block {s.name!r}: delimiters must be 1..{MAX_DELIM} bytes, got {d!r}"
                    )
                if d not in delims:
                    delims.append(d)
        n_d = len(delims)
        d_hash = _delim_hashes(delims)
        d_len = np.array([len(d) for d in delims], dtype=np.int64)
        d_start = np.full(n_d, -1, dtype=np.int64)  # the first block a delimiter opens
        b_end = np.full(MAX_BLOCKS + 1, -1, dtype=np.int64)  # the delimiter closing a block
        for b, s in enumerate(specs, start=1):
            di = delims.index(s.start.encode())
            if d_start[di] < 0:
                d_start[di] = b
            b_end[b] = delims.index(s.end.encode())
        # delimiters by last byte, longest first
        by_last: list[list[int]] = [[] for _ in range(256)]
        for i in sorted(range(n_d), key=lambda i: -len(delims[i])):
            by_last[delims[i][-1]].append(i)
        last_ptr = np.zeros(257, dtype=np.int64)
        np.cumsum([len(x) for x in by_last], out=last_ptr[1:])
        last_list = np.array([i for x in by_last for i in x], dtype=np.int64)
        self.parts = (d_hash, d_len, d_start, b_end, last_ptr, last_list)
        """This grammar's tables (delimiter indices local to it), for a table row
        (:func:`_fill`)."""
        self.arrays: tuple[np.ndarray, ...] = _table(1, token_bytes)
        _fill(self.arrays, 0, self.parts)
        """The one-grammar table :func:`feed` takes (grammar index 0)."""


_DPG = 2 * (MAX_BLOCKS + 1)  # delimiter slots per grammar row of a table (2 per block)


def _table(capacity: int, token_bytes: Sequence[bytes]) -> tuple[np.ndarray, ...]:
    """An empty table of ``capacity`` grammar rows: grammar ``gi``'s delimiters are
    ``gi * _DPG + i`` (hash, length, the block each opens), ``b_end[gi]`` maps its
    blocks to their closing delimiters and ``last_ptr[gi]`` each byte to its span of
    ``last_list`` (the delimiters ending in that byte, longest first)."""
    tb_off, tb_data = _flat_bytes(token_bytes)
    n = capacity * _DPG
    return (
        tb_off,
        tb_data,
        _POW,
        np.zeros(n, dtype=np.uint64),  # d_hash
        np.zeros(n, dtype=np.int64),  # d_len
        np.full(n, -1, dtype=np.int64),  # d_start (block ids local to the grammar)
        np.full((capacity, MAX_BLOCKS + 1), -1, dtype=np.int64),  # b_end
        np.zeros((capacity, 257), dtype=np.int64),  # last_ptr
        np.zeros(n, dtype=np.int64),  # last_list
    )


def _fill(arrays: tuple[np.ndarray, ...], gi: int, parts: tuple[np.ndarray, ...]) -> None:
    """Write a grammar's tables into row ``gi`` of a :func:`_table` (in place)."""
    d_hash, d_len, d_start, b_end, last_ptr, last_list = parts
    base = gi * _DPG
    n = len(d_hash)
    arrays[3][base : base + n] = d_hash
    arrays[4][base : base + n] = d_len
    arrays[5][base : base + n] = d_start
    arrays[6][gi] = np.where(b_end >= 0, b_end + base, -1)
    arrays[7][gi] = last_ptr + base
    arrays[8][base : base + n] = last_list + base


class GrammarTable:
    """The grammars a proposer uses, in one fixed table of ``capacity`` rows: grammar
    ``gi`` is row ``gi`` of :attr:`arrays` (what :func:`feed` takes with that ``gi``).
    Row 0 holds the default grammar; :meth:`set` writes another row in place (no other
    row moves, so requests of other grammars are not disturbed). About 5 kB per row."""

    def __init__(self, default: BlockGrammar, capacity: int) -> None:
        self.grammars: list[BlockGrammar | None] = [default] + [None] * (capacity - 1)
        self.arrays: tuple[np.ndarray, ...] = _table(capacity, default.token_bytes)
        _fill(self.arrays, 0, default.parts)

    def __len__(self) -> int:
        """Rows holding a grammar."""
        return sum(g is not None for g in self.grammars)

    def __getitem__(self, gi: int) -> BlockGrammar:
        grammar = self.grammars[gi]
        assert grammar is not None, f"grammar row {gi} is empty"
        return grammar

    def set(self, gi: int, grammar: BlockGrammar) -> None:
        """Put ``grammar`` (same token table) in row ``gi`` (1 ..), replacing any."""
        if not 0 < gi < len(self.grammars):
            raise ValueError(f"grammar row {gi} is not in 1..{len(self.grammars) - 1}")
        self.grammars[gi] = grammar
        _fill(self.arrays, gi, grammar.parts)


def _current(stack: np.ndarray, st: np.ndarray) -> int:  # pragma: no cover
    """The innermost open block id of one automaton (0 = root)."""
    d = st[DEPTH]
    return stack[d - 1] if d > 0 else 0


def _advance(
    tok: int, stack: np.ndarray, tail: np.ndarray, st: np.ndarray, g: Any, gi: int
) -> None:  # pragma: no cover
    """Feed one token's bytes to one automaton (``stack``/``tail``/``st`` rows) of
    grammar ``gi`` of table ``g`` (:attr:`GrammarTable.arrays`). ``tail[i & _RING]``
    is the hash of the first ``i`` bytes seen (``tail[0] = 0`` at a fresh start)."""
    tb_off, tb_data, pw, d_hash, d_len, d_start, b_end, last_ptr, last_list = g
    if tok < 0 or tok + 1 >= tb_off.shape[0]:
        return
    base = pw[1]
    one = np.uint64(1)
    n = st[TAILN]  # bytes seen
    h = tail[n & _RING]
    st[TAILN] = n + tb_off[tok + 1] - tb_off[tok]
    for p in range(tb_off[tok], tb_off[tok + 1]):
        c = tb_data[p]
        n += 1
        h = h * base + np.uint64(c) + one
        tail[n & _RING] = h
        for j in range(last_ptr[gi, c], last_ptr[gi, c + 1]):
            d = last_list[j]
            ln = d_len[d]
            if ln > n or h - tail[(n - ln) & _RING] * pw[ln] != d_hash[d]:
                continue
            depth = st[DEPTH]
            if depth > 0 and b_end[gi, stack[depth - 1]] == d:
                st[DEPTH] = depth - 1
            elif d_start[d] >= 0 and depth < stack.shape[0]:
                stack[depth] = d_start[d]
                st[DEPTH] = depth + 1


# The automaton's helpers are compiled without numba's reference counting (they allocate
# nothing): counting their array arguments at every call cost more than their work
# (docs/experiments/proposer_speed.md). A kernel feeds a run of tokens with one call of
# `feed`, into which `_advance` and `_current` are inlined: a call per token, even without
# counting, cost ~4x the automaton's own work (2026-12-04: 1,600 prompt tokens scanned in
# 260 us called per token, 55 us through `feed`). `current` stays callable alone (once per
# request).
current = kernel(nogil=True, _nrt=False)(_current)
_current_inline = njit(nogil=True, _nrt=False, inline="always")(_current)
_advance_inline = njit(nogil=True, _nrt=False, inline="always")(_advance)


@kernel(nogil=True, _nrt=False)
def feed(
    toks: np.ndarray,
    lo: int,
    hi: int,
    stack: np.ndarray,
    tail: np.ndarray,
    st: np.ndarray,
    g: Any,
    gi: int,
    out: np.ndarray,
) -> None:  # pragma: no cover
    """Feed the bytes of ``toks[lo:hi]`` to one automaton (``stack``/``tail``/``st`` rows,
    grammar ``gi`` of table ``g``, :func:`_advance` per token); with a non-empty ``out``,
    ``out[p - lo]`` is the block token ``p`` belongs to (the one open before it)."""
    keep = out.shape[0] > 0
    for p in range(lo, hi):
        if keep:
            out[p - lo] = _current_inline(stack, st)
        _advance_inline(toks[p], stack, tail, st, g, gi)


class BlockState:
    """One request's position in the block structure (a single automaton)."""

    __slots__ = ("grammar", "_stack", "_tail", "_st")

    def __init__(self, grammar: BlockGrammar) -> None:
        self.grammar = grammar
        self._stack = np.zeros(MAX_DEPTH, dtype=np.int64)
        self._tail = np.zeros(_RING + 1, dtype=np.uint64)
        self._st = np.zeros(2, dtype=np.int64)

    @property
    def stack(self) -> list[str]:
        """Open blocks, outermost first."""
        return [self.grammar.names[b] for b in self._stack[: self._st[DEPTH]]]

    @property
    def current(self) -> str:
        """The innermost open block (``"text"`` at top level)."""
        return self.grammar.names[current(self._stack, self._st)]

    def feed(self, token_ids: Sequence[int] | np.ndarray) -> list[tuple[str, int]]:
        """Advance over tokens; return runs ``(block, n_tokens)`` attributing each token."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return []
        out = np.empty(len(ids), dtype=np.int64)
        feed(ids, 0, len(ids), self._stack, self._tail, self._st, self.grammar.arrays, 0, out)
        cut = np.flatnonzero(np.diff(out)) + 1
        bounds = np.concatenate(([0], cut, [len(out)]))
        names = self.grammar.names
        return [
            (names[int(out[a])], int(b - a)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
