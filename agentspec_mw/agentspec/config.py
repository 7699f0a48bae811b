"""Configuration of the AgentSpec proposer: every constant in one documented place."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentspec_mw.agentspec.blocks import DEFAULT_BLOCKS

__all__ = ["AgentSpecConfig"]


class AgentSpecConfig(BaseModel):
    """Options of :class:`~agentspec_mw.agentspec.proposer.AgentSpecProposer`.

    Field names are grouped by feature: ``index_*`` (history indexes), ``calib_*``
    (acceptance calibration), ``budget_*`` (per-step allocation), ``tagfree_*`` (requests
    without tags).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks: tuple[tuple[str, str, str], ...] = tuple(
        (b.name, b.start, b.end) for b in DEFAULT_BLOCKS
    )
    """Block kinds ``(name, start, end)`` used when a request's tags name none."""
    blocks_max_per_scope: int = Field(default=16, ge=1)
    """Grammar rows (distinct block delimiter sets from tags) one isolation scope may
    hold of the proposer's 63; past this, its least recently started set no live request
    uses is replaced, or its request uses the default blocks
    (:mod:`~agentspec_mw.agentspec.grammars`). Keeps one tenant's delimiter sets from
    locking the others' out."""
    sources: tuple[Literal["iso", "agent", "scope", "local"], ...] = (
        "iso",
        "agent",
        "scope",
        "local",
    )
    """Candidate sources drafted from: ``iso`` (same scope, agent, query group and block
    kind), ``agent`` (the agent's outputs, any query), ``scope`` (every agent's outputs
    in the isolation scope), ``local`` (the request's own prompt and output). Leaving one
    out is for ablations; all four are the default at every batch size (calibration and
    the budget decide what each contributes)."""
    index_agent_live: bool = True
    """``agent`` and ``scope`` histories grow token by token as requests decode, so
    concurrent requests (fan-out siblings on other queries, other agents) draft from each
    other; ``False``: a request's output joins them only when the request stops."""
    index_max_tokens: int = Field(default=1 << 20, ge=1024)
    """Tokens the history index holds (all keys together, rounded up to a power of two);
    the oldest are evicted first. Memory: 128 bytes per token (a 64-byte record and its
    hash-table entries; 1M tokens = 128 MiB)."""
    index_walk_batch: int | None = Field(default=32, ge=1)
    """From this many requests in a step (the default: where the full floor starts,
    ``budget_floor_batch``'s default), each request's candidates are walked only as deep
    as its last candidate could use: ``min(k, max(index_walk_min, 2 × n))`` tokens,
    ``n`` = the positions of its previous candidate whose survival reached that step's
    floor (so a request drafting deep walks deeper the next step, doubling). Positions
    past the floor are never drafted; they feed the calibration of deep positions and
    the choice between sources, which smaller steps keep doing in full. ``None``: always
    walk ``k`` (the per-step time grows with ``k`` at large batch)."""
    index_walk_min: int = Field(default=8, ge=1)
    """Shallowest walk of a request under ``index_walk_batch``."""
    index_max_keys: int = Field(default=200_000, ge=1)
    """Identities (scope, agent, query group) remembered — each one's block kinds and its
    agent-wide history are keys of the index; the least recently used go."""
    calib_prior_strength: float = Field(default=8.0, gt=0)
    """Weight, in observations, of the prior in each calibration bucket."""
    calib_prior_scale: float = Field(default=0.9, gt=0, le=1)
    """Prior acceptance of a drafted token = scale × the index's count ratio."""
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
    calib_max_scopes: int = Field(default=16, ge=1)
    """Isolation scopes whose learned state (calibration, moving floor, rejection counts)
    is kept: each scope learns only from its own verified drafts, starting from the same
    fixed prior, so one tenant's traffic never moves another's drafting. About 3.4 MB per
    scope, allocated as scopes arrive; past this many, the least recently started scope
    with no live request forgets its state (:mod:`~agentspec_mw.agentspec.scopes`)."""
    budget_cost_model: str = "llama8b-h100"
    """Step-time preset used when the host gives no cost model."""
    budget_floor: float = Field(default=0.75, ge=0, le=1)
    """Survival floor ``θ`` at large batch, where the floor starts (and stays, with
    ``budget_max_rejection=None``): a position is admitted only if its survival is at
    least ``θ × min(1, log2(b) / log2(budget_floor_batch))`` (that scale to the power
    ``budget_floor_power`` while the engine has not been busy). At ``b = 1`` the floor is 0
    and the cost model alone decides (a slot is nearly free); from ``budget_floor_batch``
    on, every admitted position must be likely (the cost model's linear fit under-charges
    what a rejected token costs a busy engine: KV writes, the rejection sampler, scheduler
    trimming)."""
    budget_max_rejection: float | None = Field(default=0.15, gt=0, lt=1)
    """Rejection rate the drafts of busy steps (``b ≥ budget_floor_batch``) aim at; a
    smaller step may reject ``1 / min(1, log2(b) / log2(budget_floor_batch))`` times as
    much (its floor is scaled down by that factor; by its power ``budget_floor_power``
    while the engine has not been busy). ``θ`` moves by ``0.2 ×``
    (rejected − allowed) / 256 after every 256 verified drafted tokens, within
    [0.2, 0.95], so each deployment's drafts use the rejection it allows — no more.
    ``None``: ``θ`` stays ``budget_floor``."""
    budget_rejection_cap: float | None = Field(default=0.19, gt=0, lt=1)
    """Rejection rate all drafts together stay under once the engine has been busy
    (``budget_cap_batch`` requests or more in a step within the last 16,384 steps): as the
    running rejection of the verified drafts (every step; half-life 2^20 drafted tokens;
    before 256 are verified, the rejection the drafts' survivals predicted) climbs
    through the cap's last ``budget_cap_band``, small steps' lower floor rises linearly to
    the full ``θ`` (and their allowance to ``budget_max_rejection``), reached at the cap
    and kept over it. So the drain of a busy engine — the last few long requests,
    drafting at a floor near 0 — cannot take the whole stream's rejection over the cap.
    An engine that was never busy keeps the lower floor (a rejected token costs it almost
    nothing). ``None``: no cap."""
    budget_cap_band: float = Field(default=0.01, ge=0, lt=1)
    """Width of the band under ``budget_rejection_cap`` over which small steps' floor
    rises from their lower floor (running rejection ``cap - band`` or less) to the full
    ``θ`` (at the cap). A gradual cap holds a drain-heavy stream's rejection steadily
    under the cap instead of switching the drain's drafting off and on; ``0``: the
    switch."""
    budget_floor_power: float = Field(default=3.0, ge=1.0)
    """While the engine has not been busy (no step with ``budget_cap_batch`` requests
    within the last 16,384 steps), a step under ``budget_floor_batch`` uses the floor's
    scale to this power: ``θ × (log2(b) / log2(budget_floor_batch)) ** power`` (0.22 ×
    ``θ`` at b = 8 instead of 0.6 ×), and is allowed ``budget_max_rejection`` over that
    scale. An engine serving a few requests all along drafts closer to what the cost
    model says pays (a rejected token costs it almost nothing); a busy engine's small
    steps — its drain — keep the linear scale. 1: the linear scale always."""
    budget_cap_batch: int | None = Field(default=None, ge=2)
    """Requests in one step from which the engine counts as busy for
    ``budget_rejection_cap`` (``None``: ``budget_floor_batch``). 16 also holds the
    rejection of batch jobs of 16–31 agent runs under the cap, their drain included, but
    makes them 3–35 % slower in the replay (docs/experiments/budget_experiments.md,
    "Traces with few runs")."""
    budget_floor_batch: int = Field(default=32, ge=2)
    """Batch size from which the full floor ``θ`` applies (the brief: past ~32
    concurrent requests the state of the art is slower than no speculation)."""
    redundancy_g_min: float = Field(default=0.5, ge=0, le=1)
    """g_min of the paper's p(n) = g_min + (1 - g_min)(1 - e^(1-n)) (agreement prior)."""
    tagfree_agent_tokens: int = Field(default=64, ge=1)
    """Tag-free agent id = hash of this many leading prompt tokens."""
    tagfree_query_tokens: int = Field(default=1024, ge=1)
    """Tag-free query id = hash of this many leading prompt tokens."""
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

    @field_validator("blocks")
    @classmethod
    def _check_blocks(cls, v: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
        if not v:
            raise ValueError("blocks must name at least one (name, start, end) triple")
        for name, start, end in v:
            if not name or not start or not end:
                raise ValueError(f"blocks entry {(name, start, end)!r} has an empty field")
        return v

    @model_validator(mode="after")
    def _check_cap(self) -> AgentSpecConfig:
        cap, target = self.budget_rejection_cap, self.budget_max_rejection
        if cap is not None and target is not None and cap < target:
            raise ValueError(
                f"budget_rejection_cap={cap} is under budget_max_rejection={target}: "
                "busy steps would aim at more rejection than the whole stream may have"
            )
        if cap is not None and self.budget_cap_band >= cap:
            raise ValueError(
                f"budget_cap_band={self.budget_cap_band} is not under "
                f"budget_rejection_cap={cap}: the band would start at no rejection at all"
            )
        return self
