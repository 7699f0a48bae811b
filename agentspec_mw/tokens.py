"""Token id → bytes tables, built once per tokenizer (no tokenizer call per token)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

__all__ = ["bytes_to_unicode", "token_bytes_table"]

_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map used by byte-level BPE vocabularies."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def token_bytes_table(tokenizer: Any) -> list[bytes]:
    """``table[id]`` = the bytes token ``id`` stands for in decoded text.

    Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, SmolLM) are inverted exactly;
    SentencePiece vocabularies map ``▁`` to a space and ``<0xNN>`` to the byte; special
    tokens map to their literal text.
    """
    size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    pieces: list[str | None] = list(tokenizer.convert_ids_to_tokens(list(range(size))))
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = {tok for tok in getattr(tokenizer, "get_added_vocab", dict)()}
    dec = {c: b for b, c in bytes_to_unicode().items()}
    byte_level = sum(1 for p in pieces[:5000] if p and all(ch in dec for ch in p)) > 0.9 * min(
        5000, size
    )
    table: list[bytes] = []
    for piece in pieces:
        if piece is None:
            table.append(b"")
        elif piece in specials or piece in added:
            table.append(piece.encode("utf-8"))
        elif byte_level and all(ch in dec for ch in piece):
            table.append(bytes(dec[ch] for ch in piece))
        else:
            m = _SP_BYTE.match(piece)
            if m:
                table.append(bytes([int(m.group(1), 16)]))
            else:
                table.append(piece.replace("\u2581", " ").encode("utf-8"))
    return table
