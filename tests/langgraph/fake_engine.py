"""A fake engine backend: a real (tiny) tokenizer, scripted outputs, recorded requests."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from agentspec_mw_langgraph.backend import GenerationRequest, GenerationResult


class FakeBackend:
    """Answers ``script(prompt_text)``; records ``(prompt_text, request)`` per request."""

    model_name = "fake-engine"

    def __init__(self, tokenizer: Any, script: Callable[[str], str]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self._lock = threading.Lock()
        self.requests: list[tuple[str, GenerationRequest]] = []

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        out = []
        for r in requests:
            prompt = self.tokenizer.decode(r.prompt_token_ids)
            with self._lock:
                self.requests.append((prompt, r))
            text = self.script(prompt)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(GenerationResult(text=text, token_ids=tuple(ids), finish_reason="stop"))
        return out


class FakeStreamingBackend(FakeBackend):
    """A fake with the async/streaming surface of ``AsyncVLLMBackend``: deltas of 3 chars."""

    def _deltas(self, request: GenerationRequest) -> list[tuple[str, Any]]:
        (result,) = self.generate([request])
        items: list[tuple[str, Any]] = [
            ("delta", result.text[i : i + 3]) for i in range(0, len(result.text), 3)
        ]
        return [*items, ("final", result)]

    def stream(self, request: GenerationRequest) -> Iterator[tuple[str, Any]]:
        yield from self._deltas(request)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[tuple[str, Any]]:
        for item in self._deltas(request):
            yield item

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        return self.generate([request])[0]


class FakeStepEngine:
    """vLLM's ``LLMEngine`` surface the engine loop drives: ``add_request`` / ``step`` /
    ``abort_request``. Each step emits one more scripted token to every running request
    (cumulative outputs, like vLLM's default output kind) and records the batch size."""

    def __init__(
        self,
        answer: Callable[[list[int]], str] = lambda ids: "abcdef",
        *,
        step_s: float = 0.0,
        spec: tuple[int, list[int]] | None = None,
    ) -> None:
        self.answer = answer
        self.step_s = step_s
        self.spec = spec
        self.running: dict[str, tuple[str, int]] = {}
        self.params: dict[str, Any] = {}
        self.batch_sizes: list[int] = []
        self.aborted: list[str] = []
        self.fail_step: BaseException | None = None
        self.thread_ids: set[int] = set()

    def add_request(self, request_id: str, prompt: Any, params: Any) -> str:
        self.thread_ids.add(threading.get_ident())
        ids = list(prompt["prompt_token_ids"])
        if not ids:
            raise ValueError("empty prompt")
        self.running[request_id] = (self.answer(ids), 0)
        self.params[request_id] = params
        return request_id

    def step(self) -> list[Any]:
        import time
        from types import SimpleNamespace

        self.thread_ids.add(threading.get_ident())
        if self.fail_step is not None:
            raise self.fail_step
        if self.step_s:
            time.sleep(self.step_s)
        self.batch_sizes.append(len(self.running))
        outputs = []
        for rid, (text, n) in list(self.running.items()):
            n += 1
            finished = n >= len(text)
            metrics = None
            if finished and self.spec is not None:
                metrics = SimpleNamespace(num_draft_tokens=self.spec[0], histogram=self.spec[1])
            comp = SimpleNamespace(
                text=text[:n],
                token_ids=[ord(c) for c in text[:n]],
                finish_reason="stop" if finished else None,
                spec_decode_metrics=metrics,
            )
            outputs.append(SimpleNamespace(request_id=rid, outputs=[comp], finished=finished))
            if finished:
                del self.running[rid]
            else:
                self.running[rid] = (text, n)
        return outputs

    def abort_request(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.aborted.append(rid)
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)


class FakeLLM:
    """A ``vllm.LLM`` stand-in: ``llm_engine`` is a :class:`FakeStepEngine`."""

    def __init__(self, tokenizer: Any, engine: FakeStepEngine) -> None:
        self.tokenizer = tokenizer
        self.llm_engine = engine

    def get_tokenizer(self) -> Any:
        return self.tokenizer
