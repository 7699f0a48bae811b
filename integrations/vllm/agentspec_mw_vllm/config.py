"""Which proposer the adapter drives, and how: one validated config object.

Read, in this order of precedence, from

1. ``vllm_config.additional_config["agentspec"]`` — a dict with the fields below
   (``LLM(additional_config=...)``, ``--additional-config '{"agentspec": {...}}'`` on the
   server; :func:`agentspec_mw_vllm.engine.build_llm` and ``agentspec serve`` fill it in);
2. the environment: ``AGENTSPEC_PROPOSER``, ``AGENTSPEC_PROPOSER_OPTIONS`` (JSON object),
   ``AGENTSPEC_COST_MODEL``;
3. the defaults below.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentspec_mw.costmodel import PRESETS
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer, resolve_proposer_class

__all__ = ["ADDITIONAL_CONFIG_KEY", "MEASURED", "DrafterConfig", "drafter_section"]

#: The key of our section in vLLM's ``additional_config``.
ADDITIONAL_CONFIG_KEY = "agentspec"
#: The ``cost_model`` value that fits the engine's own step times.
MEASURED = "measured"


class DrafterConfig(BaseModel):
    """What the vLLM adapter drives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    proposer: str = Field(default="agentspec", min_length=1)
    """A builtin proposer name (none, ngram, suffix, agentspec) or a dotted class path."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options for the proposer's constructor."""
    cost_model: str = MEASURED
    """The step-time model handed to the proposer for its budget: ``"measured"`` (the
    default: a linear model fitted to this engine's own timed steps,
    :class:`agentspec_mw.costfit.MeasuredStepTime`, warm-started from ``cost_prior``), or
    a :mod:`agentspec_mw.costmodel` preset name (fixed; the presets describe one model on
    one machine each, and are what the replay uses)."""
    cost_prior: str | None = None
    """The stored fit whose relative costs the measured model starts from (and is pulled
    toward): a preset name; ``None`` = ``cpu-smollm2`` on vLLM's CPU build (measured on
    that engine), ``llama8b-h100`` elsewhere."""

    @field_validator("cost_model")
    @classmethod
    def _known_cost_model(cls, v: str) -> str:
        if v != MEASURED and v not in PRESETS:
            raise ValueError(
                f"cost_model={v!r} is neither {MEASURED!r} nor a preset; choose one of "
                f"{[MEASURED, *sorted(PRESETS)]}"
            )
        return v

    @field_validator("cost_prior")
    @classmethod
    def _known_prior(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"cost_prior={v!r} is not a preset; choose one of {sorted(PRESETS)}")
        return v

    def check_proposer(self) -> None:
        """Raise :class:`~agentspec_mw.errors.ProposerLoadError` if the class can't load."""
        resolve_proposer_class(self.proposer)

    def check_options(self) -> None:
        """Build the proposer once with :attr:`options` in a minimal
        :class:`~agentspec_mw.proposer.ProposerEnv` (a byte-level vocabulary), as the
        replay's ``check_proposers`` does, so that an option it does not take fails here
        rather than in the engine core after the model loaded.

        Raises:
            ProposerLoadError: the proposer cannot be loaded or built with these options.
        """
        make_proposer(self.proposer, _CHECK_ENV, **self.options)

    @classmethod
    def from_sources(
        cls, additional_config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
    ) -> DrafterConfig:
        """Merge ``additional_config["agentspec"]`` over the environment over the defaults."""
        env = os.environ if environ is None else environ
        merged: dict[str, Any] = {}
        if env.get("AGENTSPEC_PROPOSER"):
            merged["proposer"] = env["AGENTSPEC_PROPOSER"]
        if env.get("AGENTSPEC_PROPOSER_OPTIONS"):
            try:
                merged["options"] = json.loads(env["AGENTSPEC_PROPOSER_OPTIONS"])
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"AGENTSPEC_PROPOSER_OPTIONS is not a JSON object: {exc}"
                ) from None
        if env.get("AGENTSPEC_COST_MODEL"):
            merged["cost_model"] = env["AGENTSPEC_COST_MODEL"]
        section = (additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
        if section is not None:
            if not isinstance(section, Mapping):
                raise ValueError(
                    f"additional_config[{ADDITIONAL_CONFIG_KEY!r}] must be a dict, "
                    f"got {type(section).__name__}"
                )
            merged.update(section)
        return cls(**merged)


#: The proposer environment :meth:`DrafterConfig.check_options` builds with.
_CHECK_ENV = ProposerEnv(token_bytes=[bytes([i]) for i in range(256)])


def drafter_section(
    proposer: str,
    options: Mapping[str, Any] | None = None,
    cost_model: str | None = None,
) -> dict[str, Any]:
    """Our ``additional_config`` section for an engine that ``build_llm`` or ``agentspec
    serve`` starts: the proposer, and the options and cost model only when the caller
    chose them, so the environment (``AGENTSPEC_PROPOSER_OPTIONS``,
    ``AGENTSPEC_COST_MODEL``) still applies to the rest — a section holding every default
    would silently override it. Validated here, so a bad choice fails before an engine
    starts: the proposer's class is loaded, and when the configuration the engine will
    read (this section over this process's environment) has options, the proposer is
    built once with them (:meth:`DrafterConfig.check_options`) — an option it does not
    take would otherwise fail in the engine core after the model loaded.

    Raises:
        ValueError: an unknown cost model, or a malformed ``AGENTSPEC_PROPOSER_OPTIONS``.
        ProposerLoadError: the proposer's class cannot be loaded, or it refuses its
            options.
    """
    chosen: dict[str, Any] = {"proposer": proposer}
    if options:
        chosen["options"] = dict(options)
    if cost_model:
        chosen["cost_model"] = cost_model
    config = DrafterConfig(**chosen)
    config.check_proposer()
    engine_reads = DrafterConfig.from_sources({ADDITIONAL_CONFIG_KEY: chosen})
    if engine_reads.options:
        engine_reads.check_options()
    return config.model_dump(exclude_unset=True)
