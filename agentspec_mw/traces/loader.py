"""Streaming trace loaders for ``.jsonl``, ``.jsonl.xz`` and ``.jsonl.gz`` files.

Files are read line by line (the SWE trace is ~0.9 GB uncompressed; it is never held
whole). A malformed record raises :class:`~agentspec_mw.errors.TraceFormatError` naming
the file and line, unless ``skip_malformed=True``, which counts and skips it instead.
A record repeating an earlier record's ``(workload, run_id, call_index)`` in the same file
is malformed too (a file concatenated twice would otherwise replay every run twice).

An ``.xz`` file may hold several streams (``xz`` concatenates them, with zero padding
between); each is decoded, and bytes after a stream that are neither padding nor a valid
stream are an error, not silently dropped as :func:`lzma.open` drops them.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from agentspec_mw.errors import TraceFormatError
from agentspec_mw.traces.schema import TraceRecord

__all__ = ["MAX_ERRORS", "LoadStats", "iter_records", "open_text"]

#: Skipped-record messages kept in :attr:`LoadStats.errors`.
MAX_ERRORS = 20


@dataclass
class LoadStats:
    """Counts kept while loading; ``errors`` holds the first few skipped-record messages."""

    records: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


_BLOCK = 1 << 16


class _XzStreams(io.RawIOBase):
    """The decompressed bytes of every stream of an ``.xz`` file, one after another.

    Unlike :func:`lzma.open`, which takes anything after the first stream that fails to
    decode for trailing garbage and ends there, this decodes stream by stream: zero
    padding between streams is skipped, anything else must be a valid stream, or reading
    raises :class:`lzma.LZMAError` (a truncated stream: :class:`EOFError`).
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._fh = path.open("rb")
        self._dec = lzma.LZMADecompressor()
        self._input = b""  # compressed bytes not yet given to the decompressor

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._fh.close()
        super().close()

    def readinto(self, buffer: Any) -> int:
        data = self._read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _read(self, size: int) -> bytes:
        while True:
            if self._dec.eof:  # a stream ended: skip padding, start the next one
                rest = self._dec.unused_data.lstrip(b"\0")
                while not rest:
                    block = self._fh.read(_BLOCK)
                    if not block:
                        return b""
                    rest = block.lstrip(b"\0")
                self._dec = lzma.LZMADecompressor()
                self._input = rest
            if self._dec.needs_input and not self._input:
                self._input = self._fh.read(_BLOCK)
                if not self._input:
                    raise EOFError(
                        "compressed file ended before the end-of-stream marker was reached"
                    )
            data = self._dec.decompress(self._input, size)
            self._input = b""
            if data:
                return data


def open_text(path: str | Path) -> IO[str]:
    """Open a trace file as UTF-8 text, decompressing by its suffix (every stream of an
    ``.xz`` file; see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    name = p.name
    if name.endswith(".xz"):
        return io.TextIOWrapper(io.BufferedReader(_XzStreams(p)), encoding="utf-8")
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
    """Yield validated records of one trace file, in file order (see the module
    docstring for what is malformed)."""
    stats = stats if stats is not None else LoadStats()
    seen: dict[tuple[str, str, int], int] = {}  # (workload, run, call) -> its line
    with open_text(path) as fh:
        lineno = 0
        while True:
            try:
                line = fh.readline()
            except UnicodeDecodeError as exc:
                raise TraceFormatError(
                    str(path), lineno + 1, f"unreadable: {exc}: the file must be UTF-8 text"
                ) from None
            except (EOFError, lzma.LZMAError, zlib.error, OSError) as exc:
                raise TraceFormatError(
                    str(path),
                    lineno + 1,
                    f"unreadable: {exc}: the compressed file is truncated or corrupt; re-create it",
                ) from None
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
                first = seen.setdefault((rec.workload, rec.run_id, rec.call_index), lineno)
                if first != lineno:
                    raise TraceFormatError(
                        str(path),
                        lineno,
                        f"run {rec.run_id!r:.80} of workload {rec.workload!r:.80} has "
                        f"call_index {rec.call_index} twice (also on line {first}): remove "
                        "the repeated records (a file concatenated twice?) or give the calls "
                        "distinct call_index values",
                    )
            # ValueError: JSON Python cannot read (an integer over its digit limit);
            # RecursionError: a record nested past Python's recursion limit
            except (ValueError, RecursionError) as exc:
                if isinstance(exc, json.JSONDecodeError):
                    reason = f"invalid JSON: {exc.msg} at column {exc.colno}"
                elif isinstance(exc, ValidationError):
                    reason = _reason(exc)
                elif isinstance(exc, TraceFormatError):
                    reason = exc.reason
                elif isinstance(exc, RecursionError):
                    reason = "invalid JSON: nested too deep"
                else:
                    reason = f"invalid JSON: {exc}"
                if not skip_malformed:
                    raise TraceFormatError(str(path), lineno, reason) from None
                stats.skipped += 1
                if len(stats.errors) < MAX_ERRORS:
                    stats.errors.append(f"{path}:{lineno}: {reason}")
                continue
            stats.records += 1
            yield rec
