"""Trace recording: every LLM call as one JSONL line in the ``TraceRecord`` schema.

Records are queued and written by one background thread, so the callback that produces
them (which may run on the event loop) never waits for the disk. :meth:`close` (also run
at interpreter exit) drains the queue and stops the thread; a record queued after it
starts a new one (after the old one finished), so flushing with ``close()`` between runs
loses nothing. The file is appended to, so several runs can share it;
``agentspec replay --traces FILE`` reads it. The handler gives each recording a run id of
its own (``run:<root run id>``, or ``thread:<id>|run:<root run id>`` for a thread's query,
whose id is in the record's ``meta["query_id"]``) with ``call_index`` counted from 0, so
records several handlers or processes append, or one handler appends again after a
thread left its ``graph_history``, never repeat a ``(run_id, call_index)``, which the
loader refuses. A file that cannot be opened (a folder,
no permission) is logged once; its records are then counted in :attr:`TraceRecorder.
failed` and dropped, never queued up.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from pathlib import Path

from agentspec_mw.traces.schema import TraceRecord

__all__ = ["TraceRecorder"]

_log = logging.getLogger(__name__)
_STOP = object()
_FLUSH_POLL_S = 0.5  # how often a waiting flush() checks that the writer is alive


class TraceRecorder:
    """Append :class:`TraceRecord` lines to ``path`` from a writer thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.written = 0
        """Records written so far."""
        self.failed = 0
        """Records that could not be written or were dropped (logged; a file that does not
        open, once)."""
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()  # the writer's
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping: threading.Thread | None = None  # the writer a close() stopped last
        self._exit_hook = False
        self._broken = False  # the file could not be opened: records are dropped

    def record(self, rec: TraceRecord) -> bool:
        """Queue one record (never blocks on I/O; starts the writer thread if it is not
        running, e.g. after :meth:`close`); ``False``: dropped and counted as failed, the
        file having been found not to open."""
        line = rec.model_dump_json(exclude_none=False) + "\n"
        with self._lock:
            if self._broken:
                self.failed += 1
                return False
            if self._thread is None:
                # each writer has its own queue, and waits for the one a close() stopped
                # to finish: the two never write to the file at once, and lines stay in order
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._queue, self._stopping),
                    name="agentspec-trace-writer",
                    daemon=True,
                )
                self._thread.start()
                if not self._exit_hook:
                    self._exit_hook = True
                    atexit.register(self.close)
            self._queue.put(line)
        return True

    def flush(self) -> None:
        """Block until every record queued so far is on disk (or counted as failed);
        returns at once when the writer thread is not running."""
        done = threading.Event()
        with self._lock:
            thread, writer_queue = self._thread, self._queue
            if thread is None or not thread.is_alive():
                return
            writer_queue.put(done)
        while not done.wait(_FLUSH_POLL_S):
            if not thread.is_alive():
                return

    def close(self) -> None:
        """Drain the queue and stop the writer thread (a no-op when it is not running); a
        later :meth:`record` starts a new one, which appends to the file."""
        with self._lock:
            thread, writer_queue = self._thread, self._queue
            self._thread = None
            if thread is None:
                return
            writer_queue.put(_STOP)
            self._stopping = thread
        thread.join()

    def _run(self, items: queue.SimpleQueue[object], previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            _log.warning("agentspec: cannot open the trace file, records are dropped: %s", exc)
            with self._lock:
                self._broken = True
            self._drain(items)
            return
        with fh:
            while True:
                item = items.get()
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    fh.flush()
                    item.set()
                    continue
                try:
                    fh.write(str(item))
                    self.written += 1
                except OSError as exc:
                    self.failed += 1
                    _log.warning("agentspec: could not write a trace record: %s", exc)

    def _drain(self, items: queue.SimpleQueue[object]) -> None:
        """The queue of a file that could not be opened: records fail, flushes return."""
        while True:
            item = items.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            with self._lock:
                self.failed += 1
