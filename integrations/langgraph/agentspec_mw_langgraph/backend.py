"""What the engine-backed chat model needs from an engine, and the vLLM implementation.

:class:`EngineBackend` is two methods: the tokenizer, and ``generate`` for a batch of
token-id prompts; a backend may add ``stream`` / ``agenerate`` / ``astream`` (the chat
model uses them when present). :class:`VLLMBackend` wraps an in-process ``vllm.LLM``
(from ``agentspec_mw_vllm.engine.build_llm`` or your own) and has all four: its requests,
from any thread or event loop, run on one :class:`~.batching.EngineLoop` that steps the
engine continuously (concurrent calls share steps; text arrives token by token). Each
request's structure tags travel as ``SamplingParams(extra_args=...)``.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import queue
import sys
import threading
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agentspec_mw_langgraph.batching import EngineLoop, EngineLoopError

__all__ = [
    "BACKEND_ATTR",
    "EngineBackend",
    "GenerationRequest",
    "GenerationResult",
    "OutputTracker",
    "VLLMBackend",
    "import_vllm",
    "result_of",
    "sampling_params",
]


#: The engine attribute that holds the backend driving it (see :class:`VLLMBackend`).
BACKEND_ATTR = "_agentspec_backend"

logger = logging.getLogger("agentspec_mw_langgraph.backend")


@dataclass(frozen=True)
class GenerationRequest:
    """One completion request (token ids in, sampling settings, wire tags)."""

    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    extra_args: dict[str, str | int | float] | None = None
    structured_outputs: dict[str, Any] | None = None
    """Keyword arguments of vLLM's ``StructuredOutputsParams`` (what the output must match,
    :mod:`~agentspec_mw_langgraph.constrain`), or ``None``."""


@dataclass(frozen=True)
class GenerationResult:
    """What the engine produced for one request.

    ``num_draft_tokens`` / ``num_accepted_draft_tokens``: this request's speculation
    (tokens drafted, drafts accepted), from vLLM's per-request spec-decode metrics;
    ``None`` when the engine reports none (no speculation, or the metrics are off).
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    num_draft_tokens: int | None = None
    num_accepted_draft_tokens: int | None = None


@runtime_checkable
class EngineBackend(Protocol):
    """An engine the chat model can drive."""

    def get_tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate every request (thread-safe)."""
        ...

    @property
    def model_name(self) -> str:
        """The model's name or path."""
        ...


#: What :func:`import_vllm` imports by default: what ``build_llm`` / ``build_async_llm``
#: and :func:`sampling_params` import (each pulls in ``vllm.multimodal.media.audio``).
VLLM_MODULES = ("vllm.sampling_params", "vllm.engine.arg_utils", "vllm.entrypoints.llm")


def import_vllm(modules: Sequence[str] = VLLM_MODULES) -> None:
    """Import ``modules`` of vLLM on a short-lived thread of their own (best effort: a
    module that fails to import is left to its importer to report; no-op once imported).

    vLLM (0.32) keeps an exception raised during its import in a module global --
    ``vllm.multimodal.media.audio._torchcodec_import_exc``, where torchcodec is missing or
    unusable -- and that exception's traceback holds every frame that was on the stack
    when the module was first imported, locals included, for the life of the process.
    Imported under ``ChatAgentSpecVLLM``'s first engine build (or first request), those
    frames hold the model object, its engine and its backend, which then were never
    freed, shut down or not. On a fresh thread the pinned frames hold nothing of the
    caller's.
    """
    if all(name in sys.modules for name in modules):
        return

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the caller's own import reports it
                logger.debug("importing %s failed", name, exc_info=True)
                return

    thread = threading.Thread(target=run, name="agentspec-import-vllm", daemon=True)
    thread.start()
    thread.join()


def sampling_params(r: GenerationRequest) -> Any:
    """vLLM ``SamplingParams`` for one request (tags travel in ``extra_args``)."""
    import_vllm(("vllm.sampling_params",))  # not on this stack: see import_vllm
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    structured = r.structured_outputs
    return SamplingParams(
        max_tokens=r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        seed=r.seed,
        stop=list(r.stop) or None,
        extra_args=dict(r.extra_args) if r.extra_args else None,
        structured_outputs=StructuredOutputsParams(**structured) if structured else None,
    )


def result_of(completion: Any) -> GenerationResult:
    """A :class:`GenerationResult` from a vLLM ``CompletionOutput`` (with its spec metrics).

    vLLM fills ``completion.spec_decode_metrics`` on a finished output when the engine runs
    with ``per_request_spec_decode_metrics`` (``build_llm`` turns it on when speculating):
    drafted tokens, and a histogram of accepted drafts per verify step.
    """
    metrics = getattr(completion, "spec_decode_metrics", None)
    drafted = accepted = None
    if metrics is not None:
        drafted = int(metrics.num_draft_tokens)
        accepted = sum(j * int(n) for j, n in enumerate(metrics.histogram))
    return GenerationResult(
        text=completion.text,
        token_ids=tuple(completion.token_ids),
        finish_reason=completion.finish_reason,
        num_draft_tokens=drafted,
        num_accepted_draft_tokens=accepted,
    )


class OutputTracker:
    """Cumulative vLLM outputs of one request -> ``("delta", text)`` items, then
    ``("final", GenerationResult)``."""

    def __init__(self) -> None:
        self.text = ""
        self.completion: Any = None

    def items(self, output: Any) -> list[tuple[str, Any]]:
        comp = output.outputs[0]
        self.completion = comp
        items: list[tuple[str, Any]] = []
        if len(comp.text) > len(self.text) and comp.text.startswith(self.text):
            items.append(("delta", comp.text[len(self.text) :]))
            self.text = comp.text
        if output.finished:
            items.append(("final", result_of(comp)))
        return items


class _LLMEngineInputs:
    """The ``LLMEngine`` of a ``vllm.LLM``, fed token-id prompts rendered the way
    ``LLM.generate`` renders them (for :class:`~.batching.EngineLoop`)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = llm.llm_engine

    def add_request(self, request_id: str, prompt: Any, params: Any) -> Any:
        render = getattr(self.llm, "_preprocess_cmpl_one", None)  # vLLM 0.32/0.33
        engine_input = render(prompt) if render is not None else prompt
        return self.engine.add_request(request_id, engine_input, params)

    def step(self) -> list[Any]:
        return list(self.engine.step())

    def abort_request(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.engine.has_unfinished_requests())


class _Call:
    """One caller's request on a :class:`VLLMBackend`, made before it is submitted.

    An interrupt can reach the caller at any point -- ``KeyboardInterrupt`` (Ctrl-C in a
    notebook) anywhere, or an asyncio cancellation at an ``await`` -- including after the
    engine loop has taken the request but before the caller holds its id. :meth:`cancel`
    aborts the request by its id when the caller has it; otherwise the request's sink,
    which sees the cancellation, aborts it at its next output. Either way the engine stops
    generating it and the backend forgets it.
    """

    def __init__(self, backend: VLLMBackend, put: Any) -> None:
        self._backend = backend
        self._put = put
        self.request_id: str | None = None
        self.cancelled = False

    def submit(self, request: GenerationRequest) -> None:
        self.request_id = self._backend._submit(request, self._sink)

    def _sink(self, output: Any) -> None:
        if not self.cancelled:
            self._put(output)
            return
        request_id = getattr(output, "request_id", None)
        if request_id is not None and not getattr(output, "finished", False):
            self._backend._abort(request_id)  # cancelled before its id reached the caller

    def cancel(self) -> None:
        """Abort the request (idempotent; a finished or unsubmitted one is left alone)."""
        self.cancelled = True
        if self.request_id is not None:
            self._backend._abort(self.request_id)


class VLLMBackend:
    """An :class:`EngineBackend` over an in-process ``vllm.LLM`` (see the module doc).

    One backend per engine: two loops on one engine would step it at once. The backend
    registers itself on the engine (attribute ``_agentspec_backend``, which
    :func:`~agentspec_mw_langgraph.shared.backend_for` returns and
    ``agentspec_mw_vllm.engine.shutdown`` closes); a second one on the same engine raises.
    It unregisters only once its loop thread has exited: a new backend on an engine whose
    closed backend's loop still finishes its requests waits up to
    :attr:`previous_loop_wait_s` seconds for that loop to stop, then raises.
    :meth:`end_requests` (``shutdown`` calls it before :meth:`close`) ends the requests in
    flight instead of letting them finish.

    Raises:
        ValueError: ``llm`` already has an open backend.
        EngineLoopError: ``llm``'s closed backend's loop still steps it after
            :attr:`previous_loop_wait_s` seconds.
    """

    previous_loop_wait_s: float = 10.0
    """How long a new backend waits for a closed backend's loop on the same engine to stop."""

    def __init__(self, llm: Any) -> None:
        existing = getattr(llm, BACKEND_ATTR, None)
        loop = getattr(existing, "loop", None)
        if existing is not None and not getattr(loop, "closed", True):
            raise ValueError(
                f"this engine already has a backend ({type(existing).__name__}); share it "
                "(agentspec_mw_langgraph.shared.backend_for(engine), or pass it as engine=) "
                "or close it first: two engine loops on one engine would step it at once"
            )
        if isinstance(loop, EngineLoop) and not loop.wait_stopped(self.previous_loop_wait_s):
            raise EngineLoopError(
                "this engine's previous backend was closed, but its engine loop still steps "
                f"the engine after waiting {self.previous_loop_wait_s:g} s (it finishes the "
                "requests in flight before it stops); retry once they are done, or shut the "
                "engine down (agentspec_mw_vllm.engine.shutdown) and build a new one: two "
                "engine loops on one engine would step it at once"
            )
        self.llm = llm
        self.loop = EngineLoop(_LLMEngineInputs(llm))
        """The engine loop (its ``steps`` and ``max_in_flight`` show how calls batched)."""
        self._lock = threading.Lock()
        self._sinks: dict[str, Any] = {}  # request id -> sink, while the request runs
        self._ending = False
        try:
            setattr(llm, BACKEND_ATTR, self)
        except (AttributeError, TypeError):  # an engine that takes no attributes
            pass

    @property
    def model_name(self) -> str:
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        return str(getattr(config, "model", None) or "vllm")

    def get_tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def _submit(self, request: GenerationRequest, sink: Any) -> str:
        """Queue ``request`` on the loop; ``sink`` gets its outputs (kept until its final
        output or error, for :meth:`end_requests`). Returns its id.

        Raises:
            EngineLoopError: the backend is closing, or the loop cannot take requests.
        """
        prompt = {"prompt_token_ids": list(request.prompt_token_ids)}
        request_id = ""

        def tracked(output: Any) -> None:
            if isinstance(output, BaseException) or getattr(output, "finished", False):
                with self._lock:
                    self._sinks.pop(request_id, None)
            try:
                sink(output)
            except BaseException:  # the consumer is gone: the loop drops the request
                with self._lock:
                    self._sinks.pop(request_id, None)
                raise

        with self._lock:
            if self._ending:
                raise EngineLoopError(
                    "the engine was shut down (agentspec_mw_vllm.engine.shutdown); build a "
                    "new engine and a new model object on it"
                )
            request_id = self.loop.submit(prompt, sampling_params(request), tracked)
            self._sinks[request_id] = sink
        return request_id

    def _abort(self, request_id: str) -> None:
        with self._lock:
            self._sinks.pop(request_id, None)
        self.loop.abort(request_id)

    def end_requests(self) -> None:
        """End every request in flight and take no more (before the engine shuts down):
        each caller gets :class:`~.batching.EngineLoopError` ("engine shut down") at once,
        and the loop aborts the request, so that :meth:`close` stops it after the step it
        is in."""
        with self._lock:
            self._ending = True
            sinks, self._sinks = self._sinks, {}
        error = EngineLoopError(
            "the engine shut down (agentspec_mw_vllm.engine.shutdown) while this request "
            "ran; build a new engine and a new model object on it"
        )
        for request_id, sink in sinks.items():
            self.loop.abort(request_id)
            try:
                sink(error)
            except Exception:  # noqa: BLE001 - e.g. the consumer's event loop has closed
                logger.debug("could not end a request whose consumer is gone", exc_info=True)

    def _items(self, request: GenerationRequest, output: Any, tracker: OutputTracker) -> Any:
        if isinstance(output, BaseException):
            raise output
        items = tracker.items(output)
        if output.finished:
            self._observe(request, tracker.completion)
        return items

    def stream(self, request: GenerationRequest) -> Iterator[tuple[str, Any]]:
        """``("delta", text)`` items as the engine produces them, then ``("final", result)``.

        The request is submitted when the iteration starts, inside the generator: an
        iterator dropped (or interrupted) before or after that point leaves nothing running
        in the engine."""
        outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        return self._drain(request, _Call(self, outputs.put), outputs, submit=True)

    def _drain(
        self,
        request: GenerationRequest,
        call: _Call,
        outputs: queue.SimpleQueue[Any],
        *,
        submit: bool = False,
    ) -> Generator[tuple[str, Any]]:
        """``call``'s items (``submit``: submit it first); cancels it unless it finished."""
        tracker, done = OutputTracker(), False
        try:
            if submit:
                call.submit(request)
            while not done:
                for item in self._items(request, outputs.get(), tracker):
                    done = item[0] == "final"
                    yield item
        finally:
            if not done:  # the consumer stopped early or was interrupted, or it failed
                call.cancel()

    async def astream(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        """Async twin of :meth:`stream` (any event loop)."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        call = _Call(self, lambda out: loop.call_soon_threadsafe(outputs.put_nowait, out))
        tracker, done = OutputTracker(), False
        try:
            call.submit(request)
            while not done:
                for item in self._items(request, await outputs.get(), tracker):
                    done = item[0] == "final"
                    yield item
        finally:
            if not done:  # e.g. the task was cancelled: abort the request
                call.cancel()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Every request's result; when one fails (or the caller is interrupted), every
        request is aborted and it raises."""
        started: list[tuple[_Call, Generator[tuple[str, Any]]]] = []
        try:
            for r in requests:  # all submitted before any is drained: they share steps
                outputs: queue.SimpleQueue[Any] = queue.SimpleQueue()
                call = _Call(self, outputs.put)
                started.append((call, self._drain(r, call, outputs)))  # before submitting
                call.submit(r)
            return [_final(s) for _, s in started]
        except BaseException:
            for call, stream in started:  # a stream not started has no finally to run
                stream.close()
                call.cancel()
            raise

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        async for kind, value in self.astream(request):
            if kind == "final":
                return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable: a stream always ends with a final item")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine loop and unregister from the engine (which its owner shuts down).

        The loop finishes the requests in flight first; when its thread has not exited
        within ``timeout`` seconds the backend stays registered (closed), so that no second
        loop starts on the engine while this one still steps it (a new backend waits for
        it, see the class doc).
        """
        if not self.loop.close(timeout):
            logger.warning(
                "the engine loop still runs %g s after close() (requests in flight): the "
                "backend stays on the engine until the loop stops",
                timeout,
            )
            return
        if getattr(self.llm, BACKEND_ATTR, None) is self:
            delattr(self.llm, BACKEND_ATTR)

    def _observe(self, request: GenerationRequest, completion: Any) -> None:
        """Hook: called with each request and its finished vLLM ``CompletionOutput`` (no-op)."""


def _final(stream: Iterator[tuple[str, Any]]) -> GenerationResult:
    for kind, value in stream:
        if kind == "final":
            return value  # type: ignore[no-any-return]
    raise AssertionError("unreachable: a stream always ends with a final item")
