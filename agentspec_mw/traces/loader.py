"""Streaming trace loaders for ``.jsonl``, ``.jsonl.xz`` and ``.jsonl.gz`` files.

Files are read line by line (the SWE trace is ~0.9 GB uncompressed; it is never held
whole). A malformed record raises :class:`~agentspec_mw.errors.TraceFormatError` naming
the file and line, unless ``skip_malformed=True``, which counts and skips it instead.
"""

from __future__ import annotations

import gzip
import json
import lzma
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from agentspec_mw.errors import TraceFormatError
from agentspec_mw.traces.schema import TraceRecord

__all__ = ["LoadStats", "iter_records", "open_text"]


@dataclass
class LoadStats:
    """Counts kept while loading; ``errors`` holds the first few skipped-record messages."""

    records: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


def open_text(path: str | Path) -> IO[str]:
    """Open a trace file as UTF-8 text, decompressing by its suffix."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    name = p.name
    if name.endswith(".xz"):
        return lzma.open(p, "rt", encoding="utf-8")
    if name.endswith(".gz"):
        return gzip.open(p, "rt", encoding="utf-8")
    if name.endswith(".jsonl") or name.endswith(".json"):
        return p.open("r", encoding="utf-8")
    raise ValueError(f"{p}: unknown trace file type; expected .jsonl, .jsonl.xz or .jsonl.gz")


def _reason(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in first["loc"]) or "<record>"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {loc}: {first['msg']}{more}"


def iter_records(
    path: str | Path, *, skip_malformed: bool = False, stats: LoadStats | None = None
) -> Iterator[TraceRecord]:
    """Yield validated records of one trace file, in file order."""
    stats = stats if stats is not None else LoadStats()
    with open_text(path) as fh:
        lineno = 0
        while True:
            try:
                line = fh.readline()
            except (EOFError, lzma.LZMAError, OSError, UnicodeDecodeError) as exc:
                raise TraceFormatError(str(path), lineno + 1, f"unreadable: {exc}") from None
            if not line:
                break
            lineno += 1
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise TraceFormatError(str(path), lineno, "a record must be a JSON object")
                rec = TraceRecord.model_validate(raw)
            except (json.JSONDecodeError, ValidationError, TraceFormatError) as exc:
                if isinstance(exc, json.JSONDecodeError):
                    reason = f"invalid JSON: {exc.msg} at column {exc.colno}"
                elif isinstance(exc, ValidationError):
                    reason = _reason(exc)
                else:
                    reason = exc.reason
                if not skip_malformed:
                    raise TraceFormatError(str(path), lineno, reason) from None
                stats.skipped += 1
                if len(stats.errors) < 20:
                    stats.errors.append(f"{path}:{lineno}: {reason}")
                continue
            stats.records += 1
            yield rec
