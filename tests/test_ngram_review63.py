"""Review 63: the n-gram peer resolves ``prompt_lookup_min`` / ``prompt_lookup_max`` as
vLLM's ``SpeculativeConfig`` does (neither → 5/5; one → the other equals it; min > max
refused), so ``{"prompt_lookup_min": 2}`` runs vLLM's ``[2, 2]``, not ``[2, 5]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentspec_mw.cli import _parse_set, main
from agentspec_mw.errors import ProposerLoadError
from agentspec_mw.peers.ngram import NgramConfig, NgramProposer
from agentspec_mw.proposer import StepContext
from agentspec_mw.registry import make_proposer

pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")

#: options → the (min, max) window vLLM runs
CASES: list[tuple[dict[str, Any], tuple[int, int]]] = [
    ({}, (5, 5)),
    ({"prompt_lookup_min": 2}, (2, 2)),
    ({"prompt_lookup_max": 10}, (10, 10)),
    ({"prompt_lookup_max": 3}, (3, 3)),
    ({"prompt_lookup_min": 2, "prompt_lookup_max": 4}, (2, 4)),
    ({"prompt_lookup_min": 3, "prompt_lookup_max": 3}, (3, 3)),
    ({"prompt_lookup_min": None, "prompt_lookup_max": 7}, (7, 7)),
]

TOO_SMALL_MAX = {"prompt_lookup_min": 4, "prompt_lookup_max": 3}
REFUSED = "prompt_lookup_min=4 must be <= prompt_lookup_max=3"  # vLLM's words


@pytest.mark.parametrize(("options", "window"), CASES)
def test_bounds_resolve_as_vllm_resolves_them(
    options: dict[str, Any], window: tuple[int, int]
) -> None:
    cfg = NgramConfig(**options)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == window
    assert cfg.window == window
    assert cfg.model_dump() == {"prompt_lookup_min": window[0], "prompt_lookup_max": window[1]}


def test_same_resolution_as_vllms_speculative_config() -> None:
    speculative = pytest.importorskip("vllm.config").SpeculativeConfig
    for options, window in CASES:
        theirs = speculative(method="ngram", num_speculative_tokens=3, **options)
        assert (theirs.prompt_lookup_min, theirs.prompt_lookup_max) == window, options
    with pytest.raises(ValueError, match=REFUSED):
        speculative(method="ngram", num_speculative_tokens=3, **TOO_SMALL_MAX)


def test_min_above_max_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(ValueError, match=REFUSED):
        NgramConfig(**TOO_SMALL_MAX)
    with pytest.raises(ProposerLoadError, match=REFUSED):
        make_proposer("ngram", **TOO_SMALL_MAX)
    for bad in ({"prompt_lookup_min": 0}, {"prompt_lookup_max": 0}, {"prompt_lookup_max": 1025}):
        with pytest.raises(ProposerLoadError, match="bad options"):
            make_proposer("ngram", **bad)


def test_min_only_drafts_what_vllm_drafts() -> None:
    """Suffix ``3 4`` matches at 2 tokens (``... 3 4 70 71``) before the 4-gram
    ``1 2 3 4`` (``... 50 51``): ``[2, 2]`` stops at the 2-gram, ``[2, 5]`` goes on."""
    ctx = StepContext(
        batch_size=1,
        num_kv_tokens=0,
        max_num_batched_tokens=8192,
        num_decode_tokens=1,
        num_prefill_tokens=0,
    )
    toks = np.array([9, 3, 4, 70, 71, 1, 2, 3, 4, 50, 51, 8, 8, 1, 2, 3, 4], np.int32)

    def draft(**options: Any) -> tuple[int, ...]:
        p = NgramProposer(**options)
        p.start("r", toks)
        return p.propose(["r"], 3, ctx)[0].token_ids

    assert draft(prompt_lookup_min=2) == draft(prompt_lookup_min=2, prompt_lookup_max=2)
    assert draft(prompt_lookup_min=2) == (70, 71, 1)


def test_cli_set_reaches_the_peer() -> None:
    for item, window in (("prompt_lookup_min=2", (2, 2)), ("prompt_lookup_max=3", (3, 3))):
        options = _parse_set([f"ngram.{item}"])["ngram"]
        assert options == {item.partition("=")[0]: int(item.partition("=")[2])}
        cfg = make_proposer("ngram", **options).config  # type: ignore[attr-defined]
        assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == window


def test_replay_accepts_max_only(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """``--set ngram.prompt_lookup_max=3`` was refused (min stayed 5); vLLM accepts it."""
    argv = [
        "replay",
        "--traces",
        str(sample_path),
        "--tokenizer",
        str(tiny_tokenizer_dir),
        "--batch",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
        "--plot",
        str(tmp_path / "r.png"),
        "--proposers",
        "none,ngram",
        "--set",
        "ngram.prompt_lookup_max=3",
    ]
    assert main(argv) == 0
