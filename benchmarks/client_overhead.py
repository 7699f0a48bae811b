"""What ``with_agentspec`` costs the client: CPU time per LLM call, graphs wrapped or not.

Runs a bench app (``agentspec bench``'s shapes, or ``module:build`` / ``file.py:build``)
over a scripted chat model that answers at once (no engine), ``--n`` workflows at a time in
threads as the bench does, ``--repeats`` times, alternating plain and wrapped graphs; prints
the process CPU time per LLM call of each and the difference (the adapter's callbacks, tag
derivation and redundancy graph). In the bench the graphs run in the engine's process, on
the engine's cores, so this time comes out of the engine's.

    python benchmarks/client_overhead.py --apps demo --n 32 --repeats 2
    PYTHONPATH=EXT_APPS python benchmarks/client_overhead.py --apps supervisor_team:build
"""

from __future__ import annotations

import argparse
import functools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from pydantic import PrivateAttr

from agentspec_mw_langgraph import TaggingConfig, with_agentspec
from agentspec_mw_langgraph.bench_apps import bench_topics, resolve_app


class InstantChatModel(BaseChatModel):
    """Answers at once: a tool call while tools are bound and the last message is not a
    tool result (the demo's note lookup), else a short text; counts its calls."""

    _calls: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "instant"

    @property
    def calls(self) -> int:
        return self._calls

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self.bind(tools=list(tools), **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:
            self._calls += 1
        if kwargs.get("tools") and not isinstance(messages[-1], ToolMessage):
            call = {"name": "lookup_note", "args": {"topic": "tea"}, "id": "call-1"}
            message = AIMessage("", tool_calls=[call])
        else:
            message = AIMessage(f"The historian. Notes on {str(messages[-1].content)[:24]}")
        return ChatResult(generations=[ChatGeneration(message=message)])


def measure(app: str, n: int, repeats: int) -> dict[bool, list[float]]:
    """CPU milliseconds per LLM call, per run, for plain (``False``) and wrapped graphs."""
    shape = resolve_app(app)
    out: dict[bool, list[float]] = {False: [], True: []}
    for r in range(repeats):
        for wrapped in (False, True):
            model = InstantChatModel()
            graph = shape.build(model)
            if wrapped:
                graph = with_agentspec(graph, config=TaggingConfig())
            shape.run(graph, "warm-up")
            before_calls, before_cpu = model.calls, time.process_time()
            with ThreadPoolExecutor(max_workers=n) as pool:
                list(pool.map(functools.partial(shape.run, graph), bench_topics(r * n, n)))
            calls = model.calls - before_calls
            out[wrapped].append(1e3 * (time.process_time() - before_cpu) / max(calls, 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--apps", default="demo", help="comma list of bench apps")
    ap.add_argument("--n", type=int, default=32, help="workflows at a time")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be >= 1")
    for app in args.apps.split(","):
        got = measure(app, args.n, args.repeats)
        plain, wrapped = min(got[False]), min(got[True])
        print(
            f"{app}: CPU ms per LLM call, plain {plain:.3f}, with_agentspec {wrapped:.3f}, "
            f"adapter {wrapped - plain:+.3f} (lowest of {args.repeats} runs each)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
