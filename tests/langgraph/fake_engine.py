"""A fake engine backend: a real (tiny) tokenizer, scripted outputs, recorded requests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
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
