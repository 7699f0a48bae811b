"""Block grammars from request tags: checked before they are recorded, rows shared fairly.

Requests may name their own block delimiters (``StructureTags.blocks``). Each distinct
set becomes a :class:`~agentspec_mw.agentspec.blocks.BlockGrammar` in one row of the
proposer's :class:`~agentspec_mw.agentspec.blocks.GrammarTable` (row 0: the default
grammar), under these rules:

* **validate before you record**: a set is compiled and checked first; one that fails
  (no block, a delimiter over 64 UTF-8 bytes or not encodable, anything else) never gets
  a row — that request uses the default grammar, the failure is logged once and counted
  (:attr:`GrammarRegistry.fallbacks`), and the set is remembered as failing (bounded) so
  it is not rebuilt for every request;
* **bounded and fair**: the table has :data:`MAX_GRAMMARS` rows; a row no live request
  uses is given to a new set when the table is full (least recently started first), and
  one isolation scope holds at most ``per_scope`` rows (its own least recently started
  unused row is reused past that) — so one tenant's delimiter sets cannot lock another's
  out for longer than its own requests live;
* a set that finds no row (every row's requests still live) uses the default grammar.

Nothing here raises on what a client sends.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentspec_mw.agentspec.blocks import BlockGrammar, BlockSpec, GrammarTable

__all__ = ["MAX_GRAMMARS", "GrammarRegistry"]

logger = logging.getLogger("agentspec_mw.agentspec.proposer")
MAX_GRAMMARS = 64
"""Rows of a proposer's grammar table: the default and 63 delimiter sets from tags."""
MAX_BAD_BLOCKS = 256
"""Delimiter sets remembered as failing (least recently seen forgotten first)."""
DEFAULT_LABEL = "0"
"""Index-key label of the default grammar."""

Key = tuple[tuple[str, str], ...]


class GrammarRegistry:
    """Which table row each delimiter set has (see the module docstring)."""

    def __init__(
        self,
        default: BlockGrammar,
        token_bytes: Sequence[bytes],
        per_scope: int,
        capacity: int = MAX_GRAMMARS,
    ) -> None:
        self.table = GrammarTable(default, capacity)
        self.token_bytes = token_bytes
        self.per_scope = per_scope
        self._rows: dict[Key, int] = {}
        self._key: list[Key | None] = [None] * capacity
        self._label: list[str] = [DEFAULT_LABEL] * capacity
        self._owner: list[str | None] = [None] * capacity
        self._owned: Counter[str] = Counter()
        self.live = [0] * capacity
        """Live requests per row (a row with live requests is never reused)."""
        self._lru: OrderedDict[int, None] = OrderedDict()  # rows in use, least recent first
        self._free = list(range(capacity - 1, 0, -1))
        self._bad: OrderedDict[Any, None] = OrderedDict()
        self.fallbacks = 0
        """Requests whose tags named delimiters they did not get (they failed to build,
        or no row was free): they used the default grammar."""
        self._warned: set[str] = set()

    def __len__(self) -> int:
        """Rows holding a grammar (the default included)."""
        return len(self.table)

    def acquire(self, blocks: Any, scope: str) -> tuple[int, str]:
        """The row for a request with tags' ``blocks`` in ``scope`` (one more live
        request on it), and the grammar's label for index keys (``"0"``: the default)."""
        if blocks is None:
            return 0, DEFAULT_LABEL
        try:
            key: Key = tuple((s, e) for s, e in blocks)
            row = self._rows.get(key)
        except Exception as exc:  # not pairs, or unhashable (tags built without checks)
            return self._fallback("bad", f"{exc!r}: {blocks!r:.200}")
        if row is None:
            if key in self._bad:
                self._bad.move_to_end(key)
                return self._fallback("bad", None)
            row = self._row_for(scope)
            if row is None:
                return self._fallback("full", None)
            try:  # build and check first; only a grammar that works is recorded
                specs = [BlockSpec(f"b{i}:{s}", s, e) for i, (s, e) in enumerate(key)]
                grammar = BlockGrammar(specs, self.token_bytes)
            except Exception as exc:
                self._bad[key] = None
                while len(self._bad) > MAX_BAD_BLOCKS:
                    self._bad.popitem(last=False)
                return self._fallback("bad", f"{exc!r}: {key!r:.200}")
            self._record(row, key, grammar, scope)
        self._lru[row] = None
        self._lru.move_to_end(row)
        self.live[row] += 1
        return row, self._label[row]

    def release(self, rows: np.ndarray) -> None:
        """The live requests of ``rows`` (one entry per request) stopped."""
        live = self.live
        for r in rows.tolist():
            if r:
                live[r] -= 1

    def _row_for(self, scope: str) -> int | None:
        """A row for a new set of ``scope``: free, or the least recently started one no
        live request uses (the scope's own once it holds ``per_scope``)."""
        own = self._owned[scope] >= self.per_scope
        if not own and self._free:
            return self._free[-1]
        for row in self._lru:
            if self.live[row] == 0 and (not own or self._owner[row] == scope):
                return row
        return None

    def _record(self, row: int, key: Key, grammar: BlockGrammar, scope: str) -> None:
        old = self._key[row]
        if old is None:
            self._free.remove(row)
        else:
            del self._rows[old]
            owner = self._owner[row] or ""
            self._owned[owner] -= 1
            if self._owned[owner] <= 0:  # one entry per scope ever seen otherwise
                del self._owned[owner]
        self.table.set(row, grammar)
        self._rows[key] = row
        self._key[row] = key
        self._owner[row] = scope
        self._owned[scope] += 1
        digest = hashlib.blake2b(repr(key).encode("utf-8", "surrogatepass"), digest_size=8)
        self._label[row] = "g:" + digest.hexdigest()

    def _fallback(self, why: str, detail: str | None) -> tuple[int, str]:
        self.fallbacks += 1
        if why not in self._warned:
            self._warned.add(why)
            if why == "full":
                logger.warning(
                    "agentspec: no free row for more distinct block delimiter sets (%d rows, "
                    "at most %d per scope, rows of live requests kept); the request uses "
                    "the default blocks (logged once; counted in grammar_fallbacks)",
                    len(self._key) - 1,
                    self.per_scope,
                )
            else:
                logger.warning(
                    "agentspec: block delimiters from tags cannot be used, the request uses "
                    "the default blocks (logged once; counted in grammar_fallbacks): %s",
                    detail,
                )
        return 0, DEFAULT_LABEL
