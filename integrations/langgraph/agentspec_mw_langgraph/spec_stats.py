"""Per-call speculation stats from a vLLM server's responses.

``agentspec serve`` runs vLLM with ``--per-request-spec-decode-metrics summary``, so a
chat completion (or completion) response of one sequence (``n == 1``) carries
``metrics.speculative_decoding``: in the JSON body, or, when streaming, on the final usage
chunk -- which vLLM sends only if the request asks for usage
(``stream_options.include_usage``, i.e. ``ChatOpenAI(stream_usage=True)``).

``langchain-openai`` drops unknown response fields, so the request layers that tag a call
(:mod:`~agentspec_mw_langgraph.openai_hook` and the transports of
:mod:`~agentspec_mw_langgraph.openai`) also watch that call's responses:
:func:`watch_response` taps the body as the client reads it (no extra read; it keeps at
most one JSON body or one SSE line) and records the stats on the call's
:class:`~agentspec_mw_langgraph.context.CallTicket`. The callback handler then puts them
on the call's message as ``response_metadata["speculative_decoding"] =
{"num_draft_tokens": ..., "num_accepted_draft_tokens": ...}``, the keys of the embedded
engine path. Any failure while reading leaves the message without them; it never touches
the bytes the client reads.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from agentspec_mw_langgraph.context import CallTicket

__all__ = [
    "SPEC_DECODING_KEY",
    "STAT_KEYS",
    "stats_from_body",
    "stats_reader",
    "watch_response",
]

SPEC_DECODING_KEY = "speculative_decoding"
"""The key in ``response_metadata`` (and in vLLM's ``metrics``)."""
STAT_KEYS = ("num_draft_tokens", "num_accepted_draft_tokens")
"""The stats kept, as vLLM names them."""
_MAX_BODY = 16 << 20  # a JSON body larger than this is not parsed (no stats)
_MAX_LINE = 1 << 20  # an SSE line longer than this is skipped
_MARKER = b'"speculative_decoding"'
_log = logging.getLogger(__name__)
_lock = threading.Lock()
_warned = False
_stream_classes: dict[str, type] = {}

Record = Callable[[dict[str, int]], None]
OnError = Callable[[Exception], None]


def stats_from_body(body: object) -> dict[str, int] | None:
    """The ``STAT_KEYS`` of ``body["metrics"]["speculative_decoding"]``; ``None`` if absent.

    Raises:
        ValueError: the field is there but a stat is not a non-negative integer.
    """
    metrics = body.get("metrics") if isinstance(body, Mapping) else None
    spec = metrics.get(SPEC_DECODING_KEY) if isinstance(metrics, Mapping) else None
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        raise ValueError(f"metrics.{SPEC_DECODING_KEY} is {type(spec).__name__}, not an object")
    stats: dict[str, int] = {}
    for key in STAT_KEYS:
        value = spec.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"metrics.{SPEC_DECODING_KEY}.{key} is {value!r}")
        stats[key] = value
    return stats


class _Tap:
    """Scans the bytes of one response as they pass; records the stats at most once per
    stats-bearing body or line; disabled by its first failure."""

    def __init__(self, sse: bool, record: Record, on_error: OnError) -> None:
        self._sse = sse
        self._record = record
        self._on_error = on_error
        self._buf = bytearray()
        self._skipping = False  # inside an over-long SSE line
        self._off = False

    def feed(self, chunk: bytes) -> None:
        if self._off:
            return
        try:
            if self._sse:
                self._feed_sse(chunk)
            elif len(self._buf) + len(chunk) > _MAX_BODY:
                self._off = True
                self._buf.clear()
            else:
                self._buf += chunk
        except Exception as exc:  # noqa: BLE001 - never break the response
            self._fail(exc)

    def finish(self) -> None:
        if self._off:
            return
        try:
            if self._sse:
                self._line(bytes(self._buf))
            elif _MARKER in self._buf:  # else no stats: no need to parse
                self._found(stats_from_body(json.loads(bytes(self._buf))))
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        self._buf.clear()
        self._off = True

    def _feed_sse(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._buf += chunk[start:end]
                self._line(bytes(self._buf))
            self._buf.clear()
            start = end + 1
        if not self._skipping:
            self._buf += chunk[start:]
            if len(self._buf) > _MAX_LINE:
                self._buf.clear()
                self._skipping = True

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:") and _MARKER in line:
            self._found(stats_from_body(json.loads(line[5:])))

    def _found(self, stats: dict[str, int] | None) -> None:
        if stats is not None:
            self._record(stats)

    def _fail(self, exc: Exception) -> None:
        self._off = True
        self._buf.clear()
        self._on_error(exc)


def _tapped_stream_class(module: Any) -> type:
    """A byte stream of ``module`` (``httpx`` or a twin such as ``httpx2``) that passes
    another one's chunks through a :class:`_Tap`, sync and async (the client checks the
    stream's base classes)."""
    name = module.__name__
    with _lock:
        cls = _stream_classes.get(name)
        if cls is not None:
            return cls

    class _Tapped(module.SyncByteStream, module.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, inner: Any, tap: _Tap) -> None:
            self._inner = inner
            self._tap = tap

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._inner:
                self._tap.feed(chunk)
                yield chunk
            self._tap.finish()

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._inner:
                self._tap.feed(chunk)
                yield chunk
            self._tap.finish()

        def close(self) -> None:
            self._inner.close()

        async def aclose(self) -> None:
            await self._inner.aclose()

    with _lock:
        return _stream_classes.setdefault(name, _Tapped)


def watch_response(response: Any, record: Record, on_error: OnError) -> None:
    """Have ``record`` called with the stats of ``response`` (an ``httpx`` or ``httpx2``
    response of a completion request) when the client has read them.

    A body already read is parsed now; an unread one is tapped as it streams. Nothing
    happens for an error status or a compressed unread body. ``on_error`` gets any failure
    (the response itself is left as it was).
    """
    try:
        if response.status_code != 200:
            return
        sse = "text/event-stream" in response.headers.get("content-type", "")
        tap = _Tap(sse, record, on_error)
        if response.is_stream_consumed:  # the client read it already (a non-streaming send)
            tap.feed(response.content)
            tap.finish()
            return
        if response.headers.get("content-encoding", "identity").lower() != "identity":
            return  # the raw stream is compressed (vLLM does not compress)
        module = sys.modules[type(response).__module__.split(".", 1)[0]]
        response.stream = _tapped_stream_class(module)(response.stream, tap)
    except Exception as exc:  # noqa: BLE001 - never break the response
        on_error(exc)


def stats_reader(ticket: CallTicket, count: Callable[[str], None]) -> tuple[Record, OnError]:
    """The ``record`` and ``on_error`` of :func:`watch_response` for a response of the call
    of ``ticket``: record on the ticket; count ``"stats_read"``/``"stats_errors"`` with
    ``count``; warn about the first failure in the process (later ones are counted)."""

    def record(stats: dict[str, int]) -> None:
        ticket.record_spec_decoding(stats)
        count("stats_read")

    def on_error(exc: Exception) -> None:
        global _warned
        count("stats_errors")
        if not _warned:
            _warned = True
            _log.warning(
                "agentspec: could not read the speculation stats of a response (%s: %s); "
                "the call goes without (further failures are only counted)",
                type(exc).__name__,
                exc,
            )

    return record, on_error
