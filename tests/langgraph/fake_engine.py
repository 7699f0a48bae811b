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
