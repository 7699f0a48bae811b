"""What ``agentspec bench`` runs: :class:`BenchConfig`, its methods and the CI-sized
:func:`quick_config`."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.pregel import Pregel
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentspec_mw_langgraph.bench_apps import (
    APPS,
    BenchApp,
    BenchAppError,
    resolve_app,
    topic_count,
)

__all__ = ["METHODS", "NO_PRELOAD", "PEERS", "RESOLVE_APPS", "BenchConfig", "quick_config"]

#: method -> (``build_llm(speculative=...)``, graphs tagged).
METHODS: dict[str, tuple[str | None, bool]] = {
    "none": (None, True),
    "ngram": ("ngram", True),
    "suffix": ("suffix", True),
    "agentspec": ("agentspec", True),
    "agentspec-untagged": ("agentspec", False),
}
PEERS = ("ngram", "suffix")
"""The peers AgentSpec is compared with (the verdict names the better of them)."""
NO_PRELOAD = "/no-preload"
"""Label suffix of a method's variant that runs without vLLM's CPU preload."""
RESOLVE_APPS = "resolve_apps"
"""Validation-context key: ``{RESOLVE_APPS: False}`` reads a config without importing its
apps (a stored report of apps this process cannot import; :func:`.bench_report.read_report`)."""


def _no_repeats(field: str, v: Sequence[Any]) -> None:
    """Refuse a repeated value: the bench keys its runs by (method, app, N, repeat), so a
    second run of one would overwrite the first (a mismatch in it lost) and a second
    engine of one method would be started and never closed."""
    twice = sorted({x for i, x in enumerate(v) if x in v[:i]}, key=str)
    if twice:
        raise ValueError(f"{field}={list(v)} has duplicates ({twice}): give each once")


class _StandInChat(FakeListChatModel):
    """A chat model that never runs: what :func:`_check_builds` builds an app's graph with
    (tool binding included, as ``create_agent`` needs)."""

    responses: list[str] = ["OK"]

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


_BUILDS_OK: set[Callable[..., Any]] = set()
"""The ``build`` functions :func:`_check_builds` has seen return a graph (checked once)."""


def _check_builds(name: str, app: BenchApp) -> None:
    """Build app ``name``'s graph on a stand-in chat model, as each engine process will on
    its own, so an app whose ``build(model)`` fails or returns no compiled graph is refused
    before any engine starts (a few ms per app, once per ``build``).

    Raises:
        BenchAppError: ``build`` raised, or returned no compiled LangGraph graph.
    """
    if app.build in _BUILDS_OK:
        return
    try:
        graph = app.build(_StandInChat())
    except Exception as exc:
        raise BenchAppError(
            f"app {name!r}: build(model) failed on a stand-in chat model: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(graph, Pregel):
        hint = ": return builder.compile()" if hasattr(graph, "compile") else ""
        raise BenchAppError(
            f"app {name!r}: build(model) returned {type(graph).__name__} {str(graph)[:80]!r}; "
            "expected a compiled LangGraph graph (StateGraph(...).compile(), create_agent(...))"
            + hint
        )
    _BUILDS_OK.add(app.build)


class BenchConfig(BaseModel):
    """What ``agentspec bench`` runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ns: tuple[int, ...] = (1, 4, 16, 32, 64)
    """Concurrent workflows per run (each N once)."""
    min_workflows: int = Field(default=8, ge=1)
    """Workflows per run at least: a run at N < ``min_workflows`` keeps N in flight until
    ``min_workflows`` have finished (one workflow of the demo is ~200 tokens, ~3 s at N = 1:
    too little work to time a few per cent apart)."""
    methods: tuple[str, ...] = tuple(METHODS)
    """Methods to compare, each once (``none`` is always run: it is every ratio's
    baseline)."""
    apps: tuple[str, ...] = ("demo", "tool_loop", "reflect")
    """Workflow shapes: names in :data:`~agentspec_mw_langgraph.bench_apps.APPS`, or import
    paths ``package.module:build`` / ``path/to/file.py:build``
    (:func:`~agentspec_mw_langgraph.bench_apps.resolve_app`), each once. Each app's
    ``build(model)`` is called here on a stand-in chat model: one that fails or returns no
    compiled graph is refused before any engine starts."""
    repeats: int = Field(default=3, ge=1)
    """Runs per (shape, N, method); medians over them."""
    k: int = Field(default=8, ge=1)
    """Draft tokens per request per step."""
    max_tokens: int = Field(default=48, ge=1)
    """Tokens per LLM call at most."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature of every LLM call (0: greedy). Sampled calls are lossless in
    distribution, not token for token: their outputs are not compared with ``none``'s
    (:attr:`~.bench_report.BenchRow.identical_to_none` is ``None``), and each method's
    workflows may take other paths."""
    max_num_seqs: int = Field(default=64, ge=1)
    """The engine's concurrent requests at most."""
    kv_cache_mib: int = Field(default=1024, ge=64)
    """KV cache per engine (MiB)."""
    model: str | None = None
    """Model (``None``: the default model)."""
    preload: Literal["on", "off", "both"] = "on"
    """vLLM's CPU preload (tcmalloc, Intel OpenMP) in the engine processes."""
    run_timeout_s: float | None = Field(default=1800.0, gt=0)
    """Seconds one run (and one engine's start) may take: past it the engine process is
    killed and the bench fails, naming the run (:class:`~.bench.BenchTimeoutError`), so
    a stuck engine cannot hang the bench. Generous on purpose: the slowest run recorded
    (demo, N = 64, 32 tokens a call, 2 loaded cores; docs/results/bench_2026-12-02c_demo_
    n4_64.json) took ~105 s and the slowest start (five engines at once) ~184 s; 1800 s
    leaves room for the default 48 tokens a call, more ``max_tokens`` and a busier
    machine. Raise it for a larger model. ``None`` (``inf``, ``--run-timeout inf``): no
    limit; finite values go up to ``threading.TIMEOUT_MAX`` (~292 years), the longest
    wait Python's timeouts take."""

    @field_validator("run_timeout_s", mode="before")
    @classmethod
    def _no_limit(cls, v: Any) -> Any:
        try:
            number = float(v) if isinstance(v, int | float | str) else None
        except ValueError:
            number = None
        return None if number == math.inf else v  # inf: no limit

    @field_validator("run_timeout_s")
    @classmethod
    def _waitable(cls, v: float | None) -> float | None:
        if v is not None and v > threading.TIMEOUT_MAX:
            raise ValueError(
                f"run_timeout_s={v:g} is over {threading.TIMEOUT_MAX:g} s, the longest "
                "timeout Python waits for; give inf (--run-timeout inf) for no limit"
            )
        return v

    @field_validator("ns")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or min(v) < 1:
            raise ValueError(f"ns={list(v)} must be a non-empty list of N >= 1")
        _no_repeats("ns", v)
        return v

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"methods {unknown} unknown; choose from {list(METHODS)}")
        _no_repeats("methods", v)
        return ("none", *[m for m in v if m != "none"])

    @field_validator("apps")
    @classmethod
    def _known_apps(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if not v:
            raise ValueError(f"apps [] unknown; choose from {list(APPS)} or give module:attr")
        _no_repeats("apps", v)
        if (info.context or {}).get(RESOLVE_APPS, True):
            for name in v:  # imports an imported app's module here: its errors come first
                _check_builds(name, resolve_app(name))
        return v

    @model_validator(mode="after")
    def _distinct_topics(self) -> BenchConfig:
        # a topic run twice on one app is a query the proposers' caches have seen: their
        # acceptance would be inflated, n-gram's (no cross-request cache) not
        need = self.workflows_per_app()
        if need > topic_count():
            raise ValueError(
                f"repeats x sum(max(N, min_workflows)) = {need} workflows per app, over the "
                f"bench's {topic_count()} distinct topics: fewer repeats, smaller N or "
                "fewer min_workflows"
            )
        return self

    def workflows(self, n: int) -> int:
        """Workflows one run at N completes (N at a time)."""
        return max(n, self.min_workflows)

    def workflows_per_app(self) -> int:
        """Workflows the sweep runs on each shape (every N, every repeat): one topic each."""
        return self.repeats * sum(self.workflows(n) for n in self.ns)

    def labels(self) -> list[str]:
        """The engine processes' labels (method, and ``/no-preload`` variants)."""
        variants = {"on": [""], "off": [NO_PRELOAD], "both": ["", NO_PRELOAD]}[self.preload]
        return [m + v for v in variants for m in self.methods]


def quick_config(**overrides: Any) -> BenchConfig:
    """The CI-sized run: two workflows of the demo app, none and AgentSpec, 8 tokens a call
    (two engine processes: three took 108 s on 2 loaded cores)."""
    base: dict[str, Any] = {
        "ns": (2,),
        "min_workflows": 2,
        "methods": ("none", "agentspec"),
        "apps": ("demo",),
        "repeats": 1,
        "k": 4,
        "max_tokens": 8,
        "max_num_seqs": 8,
        "kv_cache_mib": 256,
    }
    base.update(overrides)
    return BenchConfig(**base)
