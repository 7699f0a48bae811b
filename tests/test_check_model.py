"""A model that cannot be loaded fails when the chat model is built, not at its first call."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentspec_mw.default_model import check_model
from agentspec_mw.errors import ModelNotFoundError


def test_default_folder_and_ids_are_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_model(None)
    check_model("default")
    (tmp_path / "config.json").write_text("{}")
    check_model(str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    check_model(str(gguf))  # vLLM takes a GGUF file as the model
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    check_model("Qwen/Qwen2.5-0.5B-Instruct")  # online: the download decides


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("./no/such/folder", "no such model folder"),
        ("/nonexistent/model", "no such model folder"),
        ("a/b/c", "no such model folder"),
        ("bad id!", "not a model folder nor a valid"),
    ],
)
def test_bad_names_raise_with_what_to_pass(model: str, says: str) -> None:
    with pytest.raises(ModelNotFoundError, match=says):
        check_model(model)


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="without a config.json"):
        check_model(str(tmp_path))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no such model folder"):
        check_model(str(other))


def test_offline_id_must_be_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE"):
        check_model("org/not-cached-model")


def test_chat_model_checks_at_construction() -> None:
    pytest.importorskip("langchain_core")
    from agentspec_mw_langgraph import ChatAgentSpecVLLM

    # pydantic's ValidationError (a ValueError) carries the check's message
    with pytest.raises(ValueError, match="no such model folder"):
        ChatAgentSpecVLLM(model="./no/such/model")
    ChatAgentSpecVLLM()  # the default model: nothing built yet
    ChatAgentSpecVLLM(model="./no/such/model", engine=object())  # a given engine: not checked
