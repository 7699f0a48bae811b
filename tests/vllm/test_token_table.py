"""The drafter's token table comes from vLLM's own tokenizer when vLLM holds one.

vLLM keeps one tokenizer per process (``cached_tokenizer_from_config``); the embedded
engine's front end loads it before the engine core builds the drafter, in the same
process, so the drafter no longer loads it a second time (~0.4-0.7 s of every engine
start). The table is the one a fresh ``AutoTokenizer`` gives.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentspec_mw.default_model import default_model_dir
from agentspec_mw.tokens import token_bytes_table
from agentspec_mw_vllm import adapter


def _model_config(skip: bool = False) -> Any:
    return SimpleNamespace(
        tokenizer=str(default_model_dir()),
        runner_type="generate",
        tokenizer_mode="auto",
        tokenizer_revision=None,
        trust_remote_code=False,
        skip_tokenizer_init=skip,
        hf_config=None,
    )


@pytest.fixture(scope="module")
def expected() -> list[bytes]:
    return token_bytes_table(AutoTokenizer.from_pretrained(str(default_model_dir())))


def _no_second_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the tokenizer was loaded again")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)


def test_the_table_comes_from_vllms_cached_tokenizer(
    expected: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.tokenizers import cached_tokenizer_from_config

    config = _model_config()
    cached_tokenizer_from_config(config)  # what the engine's front end did first
    _no_second_load(monkeypatch)
    assert adapter._token_bytes(config) == expected


def test_without_vllms_tokenizer_it_is_loaded_here(
    expected: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.tokenizers

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("vLLM skips its tokenizer: it must not be asked for one")

    monkeypatch.setattr(vllm.tokenizers, "cached_tokenizer_from_config", refuse)
    assert adapter._token_bytes(_model_config(skip=True)) == expected


def test_a_tokenizer_that_is_not_hugging_faces_is_not_read(
    expected: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's Mistral-format tokenizers are not Hugging Face tokenizers: the table is read
    from the Hugging Face one, as before."""
    import vllm.tokenizers

    monkeypatch.setattr(
        vllm.tokenizers, "cached_tokenizer_from_config", lambda config: SimpleNamespace()
    )
    assert adapter._token_bytes(_model_config()) == expected
