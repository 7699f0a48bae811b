"""An :class:`~.backend.EngineBackend` over vLLM's ``AsyncLLM``, with real token streaming.

``AsyncLLM`` (from ``agentspec_mw_vllm.engine.build_async_llm``) runs its engine core in a
child process and batches requests itself. Its output handler is bound to the event loop
that first uses it, so this backend drives it from one private event-loop thread, and every
caller -- sync or async, any thread, any loop -- hands its request to that loop:
``generate`` (sync, blocking), ``agenerate`` (awaitable), ``stream`` / ``astream`` (text
deltas as the engine produces them). The tags are read by the caller (in its context)
and travel in the request's ``extra_args``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from agentspec_mw_langgraph.backend import GenerationRequest, GenerationResult, sampling_params

__all__ = ["AsyncVLLMBackend"]

_END = object()


class AsyncVLLMBackend:
    """Drive an ``AsyncLLM`` from a private event-loop thread (see the module doc)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agentspec-async-engine", daemon=True
        )
        self._thread.start()

    @property
    def model_name(self) -> str:
        config = getattr(self.engine, "model_config", None)
        return str(getattr(config, "model", None) or "vllm")

    def get_tokenizer(self) -> Any:
        return self.engine.get_tokenizer()

    async def _deltas(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """``("delta", text)`` items, then ``("final", GenerationResult)``."""
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
        final = GenerationResult(last.text, tuple(last.token_ids), last.finish_reason)
        yield "final", final

    async def _collect(self, request: GenerationRequest) -> GenerationResult:
        async for kind, value in self._deltas(request):
            if kind == "final":
                return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable: _deltas always ends with a final item")

    def _submit(self, request: GenerationRequest) -> Future[GenerationResult]:
        return asyncio.run_coroutine_threadsafe(self._collect(request), self._loop)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        futures = [self._submit(r) for r in requests]  # all in flight: one engine batch
        return [f.result() for f in futures]

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        return await asyncio.wrap_future(self._submit(request))

    def _pump(self, request: GenerationRequest, put: Any) -> Future[None]:
        async def run() -> None:
            try:
                async for item in self._deltas(request):
                    put(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                put(("error", exc))
            finally:
                put(_END)

        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    def stream(self, request: GenerationRequest) -> Iterator[tuple[str, Any]]:
        """Sync stream of ``("delta", text)`` items ending with ``("final", result)``."""
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pump(request, items.put)
        while (item := items.get()) is not _END:
            if item[0] == "error":
                raise item[1]
            yield item

    async def astream(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """Async twin of :meth:`stream` (for any caller loop)."""
        caller = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        self._pump(request, lambda item: caller.call_soon_threadsafe(items.put_nowait, item))
        while (item := await items.get()) is not _END:
            if item[0] == "error":
                raise item[1]
            yield item

    def close(self) -> None:
        """Stop the private loop (the engine itself is shut down by its owner)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
