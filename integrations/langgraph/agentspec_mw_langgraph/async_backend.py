"""An :class:`~.backend.EngineBackend` over vLLM's ``AsyncLLM``, with real token streaming.

``AsyncLLM`` (from ``agentspec_mw_vllm.engine.build_async_llm``) runs its engine core in a
child process and batches requests itself. Its output handler is an asyncio task bound to
one event loop -- the loop that was running when the ``AsyncLLM`` was built, or else the
loop of its first request -- and requests only complete on that loop. This backend calls
the engine on that *home* loop: when the ``AsyncLLM`` was built outside any event loop, a
private event-loop thread of this backend; when it was built inside a running loop, that
loop. Every caller -- sync or async, any thread, any loop -- is marshalled there:
``generate`` (sync, blocking), ``agenerate`` (awaitable), ``stream`` / ``astream`` (text
deltas as the engine produces them); a caller on the home loop itself gets its request
run as a task of that loop, tracked like the others. The tags are read by the caller (in
its context) and travel in the request's ``extra_args``.

Refused, with :class:`AsyncEngineLoopError` naming the fix: a sync call from the home
loop's own thread (it would block the loop the answer needs), any call once the home
loop has stopped or closed (e.g. the ``AsyncLLM`` was built inside an ``asyncio.run`` that
has returned), any call after :meth:`AsyncVLLMBackend.close`, and any call in a forked
child of the process that made the backend (its loop thread is not there). A call on an engine
that died (its engine core failed: vLLM's output handler ended) raises
:class:`AsyncEngineDeadError`, chained to the cause where vLLM kept one.

:meth:`AsyncVLLMBackend.close` (``agentspec_mw_vllm.engine.shutdown`` calls it) ends the
requests in flight: their callers get :class:`AsyncEngineLoopError` ("backend closed")
at once; then it cancels what still runs on the private loop, stops and closes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.backend import (
    GenerationRequest,
    GenerationResult,
    result_of,
    sampling_params,
)

__all__ = ["AsyncEngineDeadError", "AsyncEngineLoopError", "AsyncVLLMBackend"]

logger = logging.getLogger("agentspec_mw_langgraph.async_backend")

_END = object()


class AsyncEngineLoopError(AgentSpecError, RuntimeError):
    """The ``AsyncLLM``'s event loop cannot serve this call (see the module doc)."""


class AsyncEngineDeadError(AgentSpecError, RuntimeError):
    """The ``AsyncLLM``'s engine died: no request can run on it any more."""


class _Pump:
    """One request of a caller on the home loop: its consumer's ``put``, its future and
    task, and whether the consumer got its end marker (after which ``put`` drops items).

    Made before the request is submitted, so that an interrupt reaching the caller at any
    point -- ``KeyboardInterrupt`` (Ctrl-C in a notebook) anywhere, or a cancellation at an
    ``await`` -- can :meth:`cancel` it: through its future once the caller holds it,
    through its task once that runs, or, submitted but not started yet, by the task itself,
    which then ends at once (vLLM never sees the request).
    """

    def __init__(self, put: Callable[[Any], Any]) -> None:
        self._put = put
        self._lock = threading.Lock()
        self._ended = False
        self._cancelled = False
        self.future: Future[None] | None = None
        self._task: asyncio.Task[Any] | None = None

    def started(self) -> bool:
        """Called by the request's task when it starts: ``False`` (end at once) when the
        request was cancelled before; otherwise it is now cancellable through the task."""
        with self._lock:
            if self._cancelled:
                return False
            self._task = asyncio.current_task()
            return True

    def cancel(self) -> None:
        """Stop the request (vLLM aborts it) and drop its items (idempotent)."""
        with self._lock:
            self._cancelled = self._ended = True
            future, task = self.future, self._task
        if future is not None:
            future.cancel()
        elif task is not None:  # the caller was interrupted before it held the future
            task.get_loop().call_soon_threadsafe(task.cancel)

    def put(self, item: Any) -> None:
        with self._lock:
            if self._ended:
                return
            if item is _END:
                self._ended = True
        try:
            self._put(item)
        except RuntimeError:  # the consumer's event loop has closed: nobody waits
            logger.debug("dropped an item of a request whose consumer is gone", exc_info=True)

    def fail(self, exc: BaseException) -> None:
        """Hand the consumer ``exc`` and the end marker (unless it got its end already)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        for item in (("error", exc), _END):
            try:
                self._put(item)
            except RuntimeError:
                logger.debug("could not fail a request whose consumer is gone", exc_info=True)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AsyncVLLMBackend:
    """Drive an ``AsyncLLM`` on the event loop that owns it (see the module doc)."""

    close_timeout_s: float = 5.0
    """How long :meth:`close` waits for the cancelled requests and for the loop thread."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._pid = os.getpid()  # the process whose event loops may run its requests
        self._lock = threading.Lock()
        self._private: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pumps: set[_Pump] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no more requests are taken)."""
        return self._closed

    @property
    def model_name(self) -> str:
        config = getattr(self.engine, "model_config", None)
        return str(getattr(config, "model", None) or "vllm")

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._private is None:
                self._private = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._private.run_forever, name="agentspec-async-engine", daemon=True
                )
                self._thread.start()
            return self._private

    def engine_death(self) -> tuple[str, BaseException | None] | None:
        """Why the engine can run no more requests -- a description and the cause, if
        vLLM kept one -- or ``None`` while it can (as far as this process can tell).

        vLLM marks a dead engine core (``engine_core.resources.engine_dead``), and its
        output handler task ends only when the engine fails (it catches the error and
        returns) or is shut down (cancelled), whereas a stopped event loop leaves it
        pending.
        """
        handler = getattr(self.engine, "output_handler", None)
        resources = getattr(getattr(self.engine, "engine_core", None), "resources", None)
        dead_error = getattr(self.engine, "dead_error", None)
        if handler is not None and handler.done() and not handler.cancelled():
            cause = handler.exception()
            if cause is not None:
                return "its output handler failed", cause
        if getattr(resources, "engine_dead", False) is True:
            return "its engine core died", dead_error
        if handler is not None and handler.done():
            loop = handler.get_loop()
            if not loop.is_closed() and loop.is_running():
                how = "was shut down" if handler.cancelled() else "stopped"
                return f"its output handler {how}", dead_error
        return None

    def home_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine's requests must run on.

        Raises:
            AsyncEngineLoopError: this backend was closed, or that loop has stopped or
                closed.
            AsyncEngineDeadError: the engine died (see :meth:`engine_death`).
        """
        if os.getpid() != self._pid:
            raise AsyncEngineLoopError(
                "this AsyncLLM backend was made by the parent of this forked process (its "
                "event loop runs there); an in-process engine cannot serve a forked child: "
                "build the model (and its engine) in the child"
            )
        if self._closed:
            raise AsyncEngineLoopError(
                "this AsyncLLM backend was closed (agentspec_mw_vllm.engine.shutdown or "
                "close()); build a new engine and a new model object on it"
            )
        death = self.engine_death()
        if death is not None:
            what, cause = death
            raise AsyncEngineDeadError(
                f"the AsyncLLM engine died ({what}"
                + (f": {cause!r}" if cause is not None else "")
                + "); no request can run on it. Build a new engine "
                "(agentspec_mw_vllm.engine.build_async_llm) and a new model object on it; "
                "the engine's log says why it died."
            ) from cause
        handler = getattr(self.engine, "output_handler", None)
        if handler is None:  # not bound yet: the first request binds it to our loop
            return self._private_loop()
        loop: asyncio.AbstractEventLoop = handler.get_loop()
        if handler.done() or loop.is_closed() or not loop.is_running():
            raise AsyncEngineLoopError(
                "this AsyncLLM is bound to an event loop that is no longer running (it was "
                "built inside a running loop, which has since stopped; vLLM completes its "
                "requests only on that loop). Build the AsyncLLM outside any event loop "
                "(then any thread or loop can use it), or inside the loop that uses it and "
                "keep that loop running."
            )
        return loop

    async def _deltas(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """``("delta", text)`` items, then ``("final", GenerationResult)`` (on the home loop)."""
        prompt = {"prompt_token_ids": request.prompt_token_ids}
        text, last = "", None
        async for out in self.engine.generate(
            prompt, sampling_params(request), request_id=f"agentspec-{uuid.uuid4().hex}"
        ):
            comp = out.outputs[0]
            if len(comp.text) > len(text):
                yield "delta", comp.text[len(text) :]
                text = comp.text
            last = comp
        if last is None:
            raise RuntimeError("the engine returned no output")
        yield "final", result_of(last)

    def _pump(
        self, home: asyncio.AbstractEventLoop, request: GenerationRequest, pump: _Pump
    ) -> None:
        """Run ``request`` on ``home``, handing its items to ``pump`` (tracked until it
        ends, so that :meth:`close` can end it).

        Raises:
            AsyncEngineLoopError: the backend was closed.
        """

        async def run() -> None:
            try:
                if pump.started():
                    async for item in self._deltas(request):
                        pump.put(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                pump.put(("error", exc))
            finally:
                pump.put(_END)
                with self._lock:
                    self._pumps.discard(pump)

        with self._lock:
            if self._closed:
                raise AsyncEngineLoopError(
                    "this AsyncLLM backend was closed; build a new engine and a new model "
                    "object on it"
                )
            self._pumps.add(pump)  # first: close() reaches it from the moment it can run
            pump.future = asyncio.run_coroutine_threadsafe(run(), home)

    def stream(self, request: GenerationRequest) -> Iterator[tuple[str, Any]]:
        """Sync stream of ``("delta", text)`` items ending with ``("final", result)``.

        The request is submitted when the iteration starts, inside the generator: an
        iterator dropped (or interrupted) before or after that point leaves nothing
        running in the engine.

        Raises:
            AsyncEngineLoopError: iterated on the home loop's thread, or that loop stopped.
        """
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        return self._drain(items, _Pump(items.put), request)

    def _submit(self, request: GenerationRequest, pump: _Pump) -> None:
        """Submit ``request`` for a blocking consumer (see :meth:`stream`)."""
        home = self.home_loop()
        if _running_loop() is home:
            raise AsyncEngineLoopError(
                "a blocking call (invoke/stream/batch) on an AsyncLLM from the thread of the "
                "event loop that owns it would block the loop its answer needs; use "
                "ainvoke/astream/abatch there, or build the AsyncLLM outside any event loop."
            )
        self._pump(home, request, pump)

    def _drain(
        self,
        items: queue.SimpleQueue[Any],
        pump: _Pump,
        submit: GenerationRequest | None = None,
    ) -> Generator[tuple[str, Any]]:
        """``pump``'s items (``submit``: submit that request first); cancels it at the end
        (a consumer that stopped early or was interrupted: vLLM aborts the request)."""
        try:
            if submit is not None:
                self._submit(submit, pump)
            while (item := items.get()) is not _END:
                if item[0] == "error":
                    raise item[1]
                yield item
        finally:
            pump.cancel()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Every request's result; when one fails (or the caller is interrupted), every
        request is cancelled and it raises."""
        started: list[tuple[_Pump, Generator[tuple[str, Any]]]] = []
        try:
            for r in requests:  # all in flight before any is drained: one engine batch
                items: queue.SimpleQueue[Any] = queue.SimpleQueue()
                pump = _Pump(items.put)
                started.append((pump, self._drain(items, pump)))  # before submitting
                self._submit(r, pump)
            return [_final(s) for _, s in started]
        except BaseException:
            for pump, stream in started:  # a stream not started has no finally to run
                stream.close()
                pump.cancel()  # vLLM aborts the request
            raise

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        async for kind, value in self.astream(request):
            if kind == "final":
                return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable: _deltas always ends with a final item")

    async def astream(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """Async twin of :meth:`stream` (any event loop, the home loop included)."""
        home = self.home_loop()
        caller = asyncio.get_running_loop()  # the home loop too: tracked, so close() ends it
        items: asyncio.Queue[Any] = asyncio.Queue()
        pump = _Pump(lambda item: caller.call_soon_threadsafe(items.put_nowait, item))
        try:
            self._pump(home, request, pump)
            while (item := await items.get()) is not _END:
                if item[0] == "error":
                    raise item[1]
                yield item
        finally:
            pump.cancel()  # e.g. the task was cancelled: vLLM aborts the request

    def close(self) -> None:
        """End the requests in flight, then stop and close the private loop, if any (the
        engine itself is shut down by its owner; idempotent).

        Every caller waiting on a request gets :class:`AsyncEngineLoopError` ("backend
        closed") at once; the requests are cancelled (vLLM aborts them), and on the
        private loop every task left is cancelled and awaited (up to
        :attr:`close_timeout_s` seconds) before the loop stops, its thread is joined and
        the loop is closed. Later calls raise :class:`AsyncEngineLoopError`.
        """
        with self._lock:
            self._closed = True
            loop, thread = self._private, self._thread
            self._private = self._thread = None
            pumps = list(self._pumps)
            self._pumps.clear()
        for pump in pumps:  # an error each: the callers' tracebacks stay apart
            pump.fail(
                AsyncEngineLoopError(
                    "the AsyncLLM backend was closed (agentspec_mw_vllm.engine.shutdown or "
                    "close()) while this request ran; build a new engine and a new model "
                    "object on it"
                )
            )
            pump.cancel()
        if loop is None or thread is None:
            return
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_wind_down(self.close_timeout_s), loop).result(
                    self.close_timeout_s + 1
                )
            except Exception:  # noqa: BLE001 - stop the loop regardless
                logger.warning("the AsyncLLM loop did not wind down cleanly", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(self.close_timeout_s)
        if thread.is_alive():
            logger.warning(
                "the AsyncLLM backend's event-loop thread still runs %g s after close(); "
                "its loop is left open",
                self.close_timeout_s,
            )
            return
        loop.close()


async def _wind_down(timeout: float) -> None:
    """Cancel every other task on the running loop and wait up to ``timeout`` s for them;
    then finish its async generators (what ``asyncio.run`` does before closing a loop)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _final(stream: Iterator[tuple[str, Any]]) -> GenerationResult:
    for kind, value in stream:
        if kind == "final":
            return value  # type: ignore[no-any-return]
    raise AssertionError("unreachable: a stream always ends with a final item")
