"""Continuous batching on one in-process vLLM engine: a private thread drives its steps.

``vllm.LLM`` is not thread-safe and its ``generate`` runs a batch to completion, so calls
from parallel graph branches either queue behind each other or wait for a whole batch.
:class:`EngineLoop` owns the ``LLMEngine`` of a ``vllm.LLM`` (``llm.llm_engine``) instead:
any thread or event loop :meth:`~EngineLoop.submit`\\ s a request with a *sink*; the loop
thread adds it to the engine before the next step, calls ``step()`` while requests are in
flight, and hands every ``RequestOutput`` (cumulative: text and token ids so far) to its
request's sink as the engine produces it. A request that arrives while others run joins
them at the next step, so concurrent branches share engine steps from then on.

Sinks run on the loop thread and must return at once (put the output on a queue; for an
asyncio consumer use ``loop.call_soon_threadsafe``). An error adding one request goes to
that request's sink only; an error in ``step()`` goes to every pending sink and stops the
loop (later submits raise :class:`EngineLoopError`). Drive the engine only through the
loop while it runs: a direct ``llm.generate`` at the same time would step (and take the
outputs of) the loop's requests.

The loop thread holds its :class:`EngineLoop` (and so the engine) only while requests
are in flight: an idle loop that nobody references is collected, and its thread exits.
A loop serves the process that made it only: in a forked child (no loop thread there)
:meth:`EngineLoop.submit` raises :class:`EngineLoopError` instead of queueing a request
nobody will run.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentspec_mw.errors import AgentSpecError

__all__ = ["EngineLoop", "EngineLoopError", "StepEngine"]

logger = logging.getLogger("agentspec_mw_langgraph.batching")

#: What a sink receives: a ``RequestOutput``, or the exception that ended its request.
Sink = Callable[[Any], None]


class EngineLoopError(AgentSpecError, RuntimeError):
    """The engine loop stopped (closed, or the engine failed); no request can run on it."""


class StepEngine(Protocol):
    """The part of vLLM's ``LLMEngine`` the loop drives."""

    def add_request(self, request_id: str, prompt: Any, params: Any) -> Any: ...

    def step(self) -> list[Any]: ...

    def abort_request(self, request_ids: list[str]) -> None: ...

    def has_unfinished_requests(self) -> bool: ...


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt: Any
    params: Any
    sink: Sink


@dataclass(frozen=True)
class _Abort:
    request_id: str


class _Stop:
    pass


class EngineLoop:
    """Run one engine's steps on a private thread for requests from any thread.

    Args:
        engine: a vLLM ``LLMEngine`` (or anything with its ``add_request`` / ``step`` /
            ``abort_request``).
        name: the loop thread's name.
    """

    def __init__(self, engine: StepEngine, *, name: str = "agentspec-engine-loop") -> None:
        self.engine = engine
        self._name = name
        self._pid = os.getpid()  # the process whose thread may run the loop
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self.steps = 0
        """Engine steps run so far."""
        self.max_in_flight = 0
        """The most requests in flight at one step so far (how much calls were batched)."""

    def submit(self, prompt: Any, params: Any, sink: Sink) -> str:
        """Queue a request; ``sink`` gets its outputs (the last one ``finished``). Returns its id.

        Raises:
            EngineLoopError: the loop was closed or its engine failed, or this process is
                a forked child of the one that made the loop.
        """
        request_id = f"agentspec-{uuid.uuid4().hex}"
        if os.getpid() != self._pid:
            raise EngineLoopError(
                "this in-process engine was built (and is stepped) by the parent of this "
                "forked process; an in-process engine cannot serve a forked child: build "
                "the model (and its engine) in the child"
            )
        with self._lock:
            if self._failure is not None:
                raise EngineLoopError(
                    f"the engine failed earlier ({self._failure!r}); build a new engine"
                ) from self._failure
            if self._closed:
                raise EngineLoopError("the engine loop was closed; build a new backend")
            if self._thread is None:
                # the thread holds the inbox and a weak reference: the loop (and its
                # engine) can be collected while idle; then the finalizer stops the thread
                thread = threading.Thread(
                    target=_serve,
                    args=(self._inbox, weakref.ref(self)),
                    name=self._name,
                    daemon=True,
                )
                try:
                    thread.start()
                finally:
                    # kept only once started: a Ctrl-C before start() left a thread that
                    # never ran, and every later call waited on it for good
                    if thread.ident is not None:
                        self._thread = thread
                        weakref.finalize(self, self._inbox.put, _Stop())
            self._inbox.put(_Add(request_id, prompt, params, sink))
        return request_id

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no more requests are taken)."""
        return self._closed

    @property
    def failure(self) -> BaseException | None:
        """The exception that stopped the loop (the engine failed), or ``None``."""
        return self._failure

    @property
    def running(self) -> bool:
        """Whether the loop thread is alive (it may step the engine)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def wait_stopped(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the loop thread to exit; whether it has (or
        never started)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def abort(self, request_id: str) -> None:
        """Stop a request (its sink gets nothing more); unknown or finished ids are ignored."""
        self._inbox.put(_Abort(request_id))

    def close(self, timeout: float = 10.0) -> bool:
        """Stop the loop thread once the requests in flight are done (idempotent).

        Waits up to ``timeout`` seconds for the thread to exit. Returns whether it has
        (``False``: it is still finishing the requests in flight and steps the engine
        until they are done; see :meth:`wait_stopped`).
        """
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(_Stop())
        return self.wait_stopped(timeout)

    def _take_commands(self, command: _Add | _Abort | _Stop | None = None) -> bool:
        """Apply ``command`` (if any) and the queued commands; ``False`` on stop."""
        while True:
            if command is None:
                try:
                    command = self._inbox.get_nowait()
                except queue.Empty:
                    return True
            if isinstance(command, _Stop):
                if self._sinks:  # finish what is in flight first
                    self._inbox.put(command)
                    return True
                return False
            if isinstance(command, _Abort):
                if self._sinks.pop(command.request_id, None) is not None:
                    self.engine.abort_request([command.request_id])
                command = None
                continue
            add, command = command, None
            try:
                self.engine.add_request(add.request_id, add.prompt, add.params)
            except Exception as exc:  # noqa: BLE001 - this request's error, to its caller
                _deliver(add.sink, exc)
                continue
            self._sinks[add.request_id] = add.sink

    def _work(self, first: _Add | _Abort | _Stop) -> bool:
        """Apply ``first`` and the queued commands, then step the engine until no request
        is in flight; ``False``: stop the thread (closed, or the engine failed)."""
        command: _Add | _Abort | _Stop | None = first
        try:
            while self._take_commands(command):
                command = None
                if not self._sinks:
                    return True  # idle: the thread waits without holding the loop
                self.max_in_flight = max(self.max_in_flight, len(self._sinks))
                outputs = self.engine.step()
                self.steps += 1
                if not outputs and not self.engine.has_unfinished_requests():
                    self._drop_lost()
                    continue
                for out in outputs:
                    if getattr(out, "finished", False):
                        sink = self._sinks.pop(out.request_id, None)
                    else:
                        sink = self._sinks.get(out.request_id)
                    if sink is not None and not _deliver(sink, out):
                        self._sinks.pop(out.request_id, None)
                        if not getattr(out, "finished", False):
                            self.engine.abort_request([out.request_id])
            return False
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
            logger.exception("the engine loop stopped: the engine raised")
            with self._lock:
                self._failure = exc
                pending = list(self._sinks.values())
                self._sinks.clear()
                while True:
                    try:
                        queued = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(queued, _Add):
                        pending.append(queued.sink)
            for sink in pending:
                _deliver(sink, exc)
            return False

    def _drop_lost(self) -> None:
        """The engine holds none of the requests still waiting here: fail them (no spin)."""
        lost, self._sinks = self._sinks, {}
        for request_id, sink in lost.items():
            _deliver(
                sink,
                RuntimeError(
                    f"the engine finished request {request_id} without a final output "
                    "(was it aborted or stepped by someone else, e.g. llm.generate on the "
                    "same engine?)"
                ),
            )


def _serve(inbox: queue.SimpleQueue[_Add | _Abort | _Stop], ref: weakref.ref[EngineLoop]) -> None:
    """The loop thread: wait for a command holding only ``inbox`` and a weak reference to
    the loop, then work on the loop until it is idle again. Exits when the loop stops, or
    has been collected (its finalizer puts a :class:`_Stop` in the inbox)."""
    while True:
        command = inbox.get()
        loop = ref()
        if loop is None or not loop._work(command):
            return
        del loop, command  # idle: hold neither (a command's sink may hold the loop's owner)


def _deliver(sink: Sink, item: Any) -> bool:
    """Call a sink; ``False`` (logged) when it raised, e.g. its event loop is closed."""
    try:
        sink(item)
    except Exception:  # noqa: BLE001 - a consumer's problem must not stop the engine
        logger.warning("dropped a request whose consumer is gone", exc_info=True)
        return False
    return True
