"""What ``agentspec bench`` runs: :class:`BenchConfig`, its methods and the CI-sized
:func:`quick_config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from agentspec_mw_langgraph.bench_apps import APPS, resolve_app, topic_count

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


class BenchConfig(BaseModel):
    """What ``agentspec bench`` runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ns: tuple[int, ...] = (1, 4, 16, 32, 64)
    """Concurrent workflows per run."""
    min_workflows: int = Field(default=8, ge=1)
    """Workflows per run at least: a run at N < ``min_workflows`` keeps N in flight until
    ``min_workflows`` have finished (one workflow of the demo is ~200 tokens, ~3 s at N = 1:
    too little work to time a few per cent apart)."""
    methods: tuple[str, ...] = tuple(METHODS)
    """Methods to compare (``none`` is always run: it is every ratio's baseline)."""
    apps: tuple[str, ...] = ("demo", "tool_loop", "reflect")
    """Workflow shapes: names in :data:`~agentspec_mw_langgraph.bench_apps.APPS`, or import
    paths ``package.module:build`` / ``path/to/file.py:build``
    (:func:`~agentspec_mw_langgraph.bench_apps.resolve_app`)."""
    repeats: int = Field(default=3, ge=1)
    """Runs per (shape, N, method); medians over them."""
    k: int = Field(default=8, ge=1)
    """Draft tokens per request per step."""
    max_tokens: int = Field(default=48, ge=1)
    """Tokens per LLM call at most."""
    max_num_seqs: int = Field(default=64, ge=1)
    """The engine's concurrent requests at most."""
    kv_cache_mib: int = Field(default=1024, ge=64)
    """KV cache per engine (MiB)."""
    model: str | None = None
    """Model (``None``: the default model)."""
    preload: Literal["on", "off", "both"] = "on"
    """vLLM's CPU preload (tcmalloc, Intel OpenMP) in the engine processes."""

    @field_validator("ns")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or min(v) < 1:
            raise ValueError(f"ns={list(v)} must be a non-empty list of N >= 1")
        return v

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"methods {unknown} unknown; choose from {list(METHODS)}")
        return ("none", *[m for m in v if m != "none"])

    @field_validator("apps")
    @classmethod
    def _known_apps(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if not v:
            raise ValueError(f"apps [] unknown; choose from {list(APPS)} or give module:attr")
        if (info.context or {}).get(RESOLVE_APPS, True):
            for name in v:  # imports an imported app's module here: its errors come first
                resolve_app(name)
        return v

    @model_validator(mode="after")
    def _distinct_topics(self) -> BenchConfig:
        # a topic run twice on one app is a query the proposers' caches have seen: their
        # acceptance would be inflated, n-gram's (no cross-request cache) not
        need = self.repeats * sum(self.workflows(n) for n in self.ns)
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
