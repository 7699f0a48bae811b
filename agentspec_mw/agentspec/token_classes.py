"""Text class of every token id: a feature of the acceptance calibration.

Where a copied continuation departs from the text being written is not random: a draft
that runs into a new line, or into the next word, is more likely to be wrong than one
that finishes a word it has started. The calibration (see
:mod:`~agentspec_mw.agentspec.proposer`) therefore splits each of its cells by the
class of the drafted token and by whether the draft already crossed a line break.

A class is read once per token table from the token's bytes (no tokenizer call):

* ``0`` — whitespace only (spaces, tabs, line breaks) or empty;
* ``1`` — no letter or digit: punctuation, symbols, a piece of a multi-byte character;
* ``2`` — a letter or digit after leading whitespace: a word starts;
* ``3`` — a letter or digit from its first character: a word goes on (or a line starts
  with one).

Bit :data:`NEWLINE` is set when the token contains a line break.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["NEWLINE", "N_CLASSES", "token_classes"]

N_CLASSES = 4
"""Text classes (the low two bits of a token's code; a power of two below :data:`NEWLINE`)."""
NEWLINE = 4
"""Bit set in a token's code when its text contains a line break."""

_CACHE: dict[int, tuple[Sequence[bytes], np.ndarray]] = {}


def _code(b: bytes) -> int:
    text = b.decode("utf-8", "ignore")
    nl = NEWLINE if b"\n" in b else 0
    if not b or (text and not text.strip()):
        return nl  # whitespace only (or empty)
    if not any(ch.isalnum() for ch in text):
        return 1 | nl  # symbols, punctuation, or a partial character (decodes to "")
    return (2 if text[0].isspace() else 3) | nl


def token_classes(token_bytes: Sequence[bytes]) -> np.ndarray:
    """``codes[id]`` (int8): the class of token ``id`` | :data:`NEWLINE` if it has one.

    Built once per token table object: later calls with the same list return the same
    array (shared — do not modify it).
    """
    hit = _CACHE.get(id(token_bytes))
    if hit is not None and hit[0] is token_bytes:
        return hit[1]
    codes = np.fromiter(map(_code, token_bytes), np.int8, len(token_bytes))
    _CACHE[id(token_bytes)] = (token_bytes, codes)  # keeps the table alive
    return codes
