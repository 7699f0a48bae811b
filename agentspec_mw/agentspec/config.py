"""Configuration of the AgentSpec proposer: every option in one documented place.

:class:`AgentSpecConfig` holds what a user deploying the proposer may need to change
(memory, tenants, block kinds, the step-time preset, CPU time at large batch).
:class:`_ExperimentalConfig` (the ``experimental`` field) holds the switches that exist
for ablations and the model's own constants: changing them is for benchmarks
(``benchmarks/ablate_sources.py``), not for deployments.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentspec_mw.agentspec.blocks import DEFAULT_BLOCKS

__all__ = ["AgentSpecConfig"]


class _ExperimentalConfig(BaseModel):
    """Ablation switches and model constants of the AgentSpec proposer (``experimental``
    of :class:`AgentSpecConfig`; ``--set agentspec.experimental.OPTION=VALUE`` in the
    replay). The defaults are the design; each switch turns one part of it off."""

    # every number finite: `--set ...=Infinity` or NaN is an error, not a silent no-draft
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    sources: tuple[Literal["iso", "agent", "scope", "local"], ...] = (
        "iso",
        "agent",
        "scope",
        "local",
    )
    """Candidate sources drafted from: ``iso`` (same scope, agent, query group and block
    kind), ``agent`` (the agent's outputs, any query), ``scope`` (every agent's outputs
    in the isolation scope), ``local`` (the request's own prompt and output). All four
    at every batch size (calibration and the budget decide what each contributes);
    leaving one out is an ablation."""
    index_agent_live: bool = True
    """``agent`` and ``scope`` histories grow token by token as requests decode, so
    concurrent requests (fan-out siblings on other queries, other agents) draft from each
    other; ``False``: a request's output joins them only when the request stops."""
    index_walk_min: int = Field(default=8, ge=1)
    """Shallowest walk of a request under ``index_walk_batch``."""
    calib_prior_strength: float = Field(default=8.0, gt=0)
    """Weight, in observations, of the prior in each calibration cell (and of a cell's
    acceptance in each of its fine cells)."""
    calib_prior: Literal["stored", "redundancy"] = "stored"
    """Where each calibration cell starts: ``stored``, the acceptance the proposer
    learned per cell on recorded agent traces (``agentspec_mw/data/calibration_prior.npz``,
    made by ``benchmarks/fit_calibration_prior.py``; its traces and command are in the
    file), or ``redundancy``, ``calib_prior_scale`` × the paper's redundancy score. Either
    way a scope's own verified drafts take over, with ``calib_prior_strength``."""
    calib_prior_scale: float = Field(default=0.9, gt=0, le=1)
    """Prior acceptance of a drafted token = scale × the paper's redundancy score
    (``calib_prior="redundancy"``)."""
    calib_token_classes: bool = True
    """Split every calibration cell by the drafted token's text class (whitespace,
    symbols, a word starting, a word going on; :mod:`~agentspec_mw.agentspec.token_classes`)
    and by whether the draft already crossed a line break: a split cell's acceptance is
    its own counts shrunk toward its cell's acceptance with weight
    ``calib_prior_strength``, so a class seldom seen acts like the whole cell. ``False``:
    cells only (the ablation)."""
    calib_request_record: bool = True
    """Split every fine cell further by the request's record: how many verified
    candidate tokens in a row its candidates got right (0, 1–3, 4–15, 16+; drafted or
    not, so only what the verifier has already seen), shrunk toward the cell like the
    token classes. Takes effect with ``calib_token_classes`` (whose shrinkage it uses).
    ``False``: one record bucket (the ablation)."""
    redundancy_g_min: float = Field(default=0.5, ge=0, le=1)
    """g_min of the paper's p(n) = g_min + (1 - g_min)(1 - e^(1-n)) (agreement prior)."""
    tagfree_scan_tokens: int = Field(default=64, ge=1)
    """Prompt tokens scanned at start to find the open block (e.g. ReAct ``Thought 3:``)."""

    @field_validator("sources")
    @classmethod
    def _check_sources(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("sources must name at least one of 'iso', 'agent', 'scope', 'local'")
        if len(set(v)) != len(v):
            raise ValueError(f"sources {v!r} names a source twice")
        return v


_EXPERIMENTAL = frozenset(_ExperimentalConfig.model_fields)


class AgentSpecConfig(BaseModel):
    """Options of :class:`~agentspec_mw.agentspec.proposer.AgentSpecProposer`.

    Field names are grouped by feature: ``blocks*`` (block kinds), ``index_*`` (history
    indexes), ``calib_*`` (acceptance calibration), ``budget_*`` (per-step allocation),
    ``tagfree_*`` (requests without tags). Ablation switches and model constants are in
    ``experimental``; passing one of them at the top level (the former place) still
    works, with a ``DeprecationWarning``. A key ``"experimental.OPTION"`` (as ``--set
    agentspec.experimental.OPTION=VALUE`` gives) sets that experimental option.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    blocks: tuple[tuple[str, str, str], ...] = tuple(
        (b.name, b.start, b.end) for b in DEFAULT_BLOCKS
    )
    """Block kinds ``(name, start, end)`` used when a request's tags name none: set them
    to your agents' own delimiters (a block kind is part of the ``iso`` history's key)."""
    blocks_max_per_scope: int = Field(default=16, ge=1)
    """Grammar rows (distinct block delimiter sets from tags) one isolation scope may
    hold of the proposer's 63; past this, its least recently started set no live request
    uses is replaced, or its request uses the default blocks
    (:mod:`~agentspec_mw.agentspec.grammars`). Keeps one tenant's delimiter sets from
    locking the others' out: lower it when many tenants send their own delimiters."""
    index_max_tokens: int = Field(default=1 << 20, ge=1024, le=1 << 32)
    """Tokens the history index holds (all keys together, rounded up to a power of two);
    the oldest are evicted first. Memory: 128 bytes per token (a 64-byte record and its
    hash-table entries; 1M tokens = 128 MiB; the most, 2^32 tokens, 512 GiB), reserved
    when the proposer is built and resident as the index is first written."""
    index_max_keys: int = Field(default=200_000, ge=1)
    """Identities (scope, agent, query group) remembered — each one's block kinds and its
    agent-wide history are keys of the index; the least recently used go. Raise it when
    more distinct agents and queries than this are live within the index's span."""
    index_walk_batch: int | None = Field(default=32, ge=1)
    """From this many requests in a step, each request's candidates are walked only as
    deep as its last candidate could use: ``min(k, max(experimental.index_walk_min,
    2 × n))`` tokens, ``n`` = the positions of its previous candidate whose survival
    reached that step's admission bound (the least survival that can pay for its slot,
    :func:`~agentspec_mw.agentspec.budget.admission_bound`), so a request drafting deep
    walks deeper the next step, doubling. Positions under the bound are never drafted;
    they feed the calibration of deep positions and the choice between sources, which
    smaller steps keep doing in full. ``None``: always walk ``k`` (the per-step time
    grows with ``k`` at large batch; for a host with CPU time to spare)."""
    calib_max_scopes: int = Field(default=16, ge=1)
    """Learned states (calibration, verified draft counts) kept, one per isolation scope
    and decoding regime it serves (greedy, sampled, constrained): each learns only from
    its own verified drafts, starting from the same fixed prior, so one tenant's traffic
    never moves another's drafting. About 3.4 MB each, allocated as they arrive; past
    this many, the least recently started one with no live request forgets its state
    (:mod:`~agentspec_mw.agentspec.scopes`). Set it to the tenants active at once times
    the regimes their requests use."""
    budget_cost_model: str = "llama8b-h100"
    """Step-time preset used when the host gives no cost model: the preset nearest your
    model and GPU (``agentspec replay --help`` lists them)."""
    tagfree_agent_tokens: int = Field(default=64, ge=1)
    """Tag-free agent id = hash of this many leading prompt tokens: about the length of
    your agents' distinct system prompt heads (untagged traffic only)."""
    tagfree_query_tokens: int = Field(default=1024, ge=1)
    """Tag-free query id = hash of this many leading prompt tokens: long enough to reach
    past the shared instructions into the query (untagged traffic only)."""
    experimental: _ExperimentalConfig = Field(default_factory=_ExperimentalConfig)
    """Ablation switches and model constants (:class:`_ExperimentalConfig`, listed
    below): for benchmarks, not deployments."""

    @model_validator(mode="before")
    @classmethod
    def _route_experimental(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        moved = [k for k in data if k in _EXPERIMENTAL]
        dotted = [k for k in data if isinstance(k, str) and k.startswith("experimental.")]
        if not moved and not dotted:
            return data
        exp = data.get("experimental", {})
        try:
            exp = dict(exp.model_dump() if isinstance(exp, BaseModel) else exp)
        except (TypeError, ValueError):
            return data  # not options (None, a number...): the field's validation says so
        data = dict(data)
        for k in dotted:
            exp[k.removeprefix("experimental.")] = data.pop(k)
        if moved:
            warnings.warn(
                f"AgentSpecConfig({', '.join(moved)}=...): experimental options moved to "
                f"experimental={{{', '.join(repr(k) + ': ...' for k in moved)}}} "
                "(replay: --set agentspec.experimental.OPTION=VALUE)",
                DeprecationWarning,
                stacklevel=2,
            )
            for k in moved:
                exp[k] = data.pop(k)
        data["experimental"] = exp
        return data

    @field_validator("budget_cost_model")
    @classmethod
    def _preset(cls, v: str) -> str:
        from agentspec_mw.costmodel import PRESETS

        if v not in PRESETS:
            raise ValueError(
                f"budget_cost_model={v!r} is not a preset; choose one of {sorted(PRESETS)}"
            )
        return v

    @field_validator("blocks")
    @classmethod
    def _check_blocks(cls, v: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
        if not v:
            raise ValueError("blocks must name at least one (name, start, end) triple")
        for name, start, end in v:
            if not name or not start or not end:
                raise ValueError(f"blocks entry {(name, start, end)!r} has an empty field")
        return v
