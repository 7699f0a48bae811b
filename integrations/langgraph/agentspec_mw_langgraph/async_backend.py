"""An :class:`~.backend.EngineBackend` over vLLM's ``AsyncLLM``, with real token streaming.

``AsyncLLM`` (from ``agentspec_mw_vllm.engine.build_async_llm``) runs its engine core in a
child process and batches requests itself. Its output handler is an asyncio task bound to
one event loop -- the loop that was running when the ``AsyncLLM`` was built, or else the
loop of its first request -- and requests only complete on that loop. This backend calls
the engine on that *home* loop: when the ``AsyncLLM`` was built outside any event loop, a
private event-loop thread of this backend; when it was built inside a running loop, that
loop. Every caller -- sync or async, any thread, any loop -- is marshalled there:
``generate`` (sync, blocking), ``agenerate`` (awaitable), ``stream`` / ``astream`` (text
deltas as the engine produces them); a caller on the home loop itself runs the engine
call directly. The tags are read by the caller (in its context) and travel in the
request's ``extra_args``.

Refused, with :class:`AsyncEngineLoopError` naming the fix: a sync call from the home
loop's own thread (it would block the loop the answer needs), and any call once the home
loop has stopped or closed (e.g. the ``AsyncLLM`` was built inside an ``asyncio.run`` that
has returned).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.backend import (
    GenerationRequest,
    GenerationResult,
    result_of,
    sampling_params,
)

__all__ = ["AsyncEngineLoopError", "AsyncVLLMBackend"]

_END = object()


class AsyncEngineLoopError(AgentSpecError, RuntimeError):
    """The ``AsyncLLM``'s event loop cannot serve this call (see the module doc)."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class AsyncVLLMBackend:
    """Drive an ``AsyncLLM`` on the event loop that owns it (see the module doc)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._private: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

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

    def home_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine's requests must run on.

        Raises:
            AsyncEngineLoopError: that loop has stopped or closed.
        """
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
        self, home: asyncio.AbstractEventLoop, request: GenerationRequest, put: Callable[..., Any]
    ) -> Future[None]:
        async def run() -> None:
            try:
                async for item in self._deltas(request):
                    put(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                put(("error", exc))
            finally:
                put(_END)

        return asyncio.run_coroutine_threadsafe(run(), home)

    def stream(self, request: GenerationRequest) -> Iterator[tuple[str, Any]]:
        """Sync stream of ``("delta", text)`` items ending with ``("final", result)``.

        Raises:
            AsyncEngineLoopError: called on the home loop's thread, or that loop stopped.
        """
        home = self.home_loop()
        if _running_loop() is home:
            raise AsyncEngineLoopError(
                "a blocking call (invoke/stream/batch) on an AsyncLLM from the thread of the "
                "event loop that owns it would block the loop its answer needs; use "
                "ainvoke/astream/abatch there, or build the AsyncLLM outside any event loop."
            )
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        future = self._pump(home, request, items.put)  # submitted now, iterated later
        return self._drain(items, future)

    @staticmethod
    def _drain(items: queue.SimpleQueue[Any], future: Future[None]) -> Iterator[tuple[str, Any]]:
        try:
            while (item := items.get()) is not _END:
                if item[0] == "error":
                    raise item[1]
                yield item
        finally:
            future.cancel()  # a consumer that stopped early: vLLM aborts the request

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        streams = [self.stream(r) for r in requests]  # all in flight: one engine batch
        return [_final(s) for s in streams]

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        async for kind, value in self.astream(request):
            if kind == "final":
                return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable: _deltas always ends with a final item")

    async def astream(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """Async twin of :meth:`stream` (any event loop, the home loop included)."""
        home = self.home_loop()
        caller = asyncio.get_running_loop()
        if caller is home:
            async for item in self._deltas(request):
                yield item
            return
        items: asyncio.Queue[Any] = asyncio.Queue()
        future = self._pump(
            home, request, lambda item: caller.call_soon_threadsafe(items.put_nowait, item)
        )
        try:
            while (item := await items.get()) is not _END:
                if item[0] == "error":
                    raise item[1]
                yield item
        finally:
            future.cancel()

    def close(self) -> None:
        """Stop the private loop, if any (the engine itself is shut down by its owner)."""
        with self._lock:
            loop, thread = self._private, self._thread
            self._private = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)


def _final(stream: Iterator[tuple[str, Any]]) -> GenerationResult:
    for kind, value in stream:
        if kind == "final":
            return value  # type: ignore[no-any-return]
    raise AssertionError("unreachable: a stream always ends with a final item")
