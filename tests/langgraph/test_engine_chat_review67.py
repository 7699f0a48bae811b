"""Session 67's review of ``ChatAgentSpecVLLM`` against LangChain's conventions: unknown
keywords are errors, tokens are counted with the model's own tokenizer and chat template,
the model is named by its name (not a cache folder), and a non-numeric call option gets an
error that names it. Each test failed before its fix."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages

from agentspec_mw.default_model import DEFAULT_MODEL_NAME
from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.toolformat import render_chat_prompt

from .fake_engine import FakeBackend


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"model_name": "org/model"}, "did you mean 'model'"),  # ChatOpenAI's name
        ({"max_token": 16}, "did you mean 'max_tokens'"),
        ({"temprature": 0.7}, "did you mean 'temperature'"),
        ({"speculative_method": None}, "did you mean 'speculative'"),
    ],
)
def test_unknown_keyword_is_an_error(kwargs: dict[str, Any], hint: str) -> None:
    with pytest.raises(ValueError, match=hint):
        ChatAgentSpecVLLM(**kwargs)


def test_an_unknown_drafter_is_an_error_at_construction(tiny_tokenizer: Any) -> None:
    """A drafter name the engine could never load fails when the model is made (it failed
    at the first call, after the engine's set-up); dotted paths and builtins pass, and a
    given engine's drafter is the engine's."""
    with pytest.raises(ValueError, match="proposer 'eagle3' is neither a builtin"):
        ChatAgentSpecVLLM(speculative="eagle3")
    for ok in ("agentspec", "ngram", "suffix", "none", "my_pkg.drafters.Mine", None):
        ChatAgentSpecVLLM(speculative=ok)
    ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda _: "ok"), speculative="eagle3")


def test_langchain_fields_still_accepted(tiny_tokenizer: Any) -> None:
    model = ChatAgentSpecVLLM(
        engine=FakeBackend(tiny_tokenizer, lambda _: "ok"),
        tags=["t"],
        metadata={"m": 1},
        streaming=True,
        disable_streaming=False,
    )
    assert model.invoke("hi").content == "ok"  # streaming=True: invoke goes through _stream


def _history(n: int) -> list[Any]:
    out: list[Any] = [SystemMessage("You are terse.")]
    for i in range(n):
        out += [HumanMessage(f"question {i}: " + "tell me more " * 10), AIMessage("more " * 20)]
    return out


def test_counts_tokens_as_the_engine_sees_the_prompt(tiny_tokenizer: Any) -> None:
    backend = FakeBackend(tiny_tokenizer, lambda _: "ok")
    model = ChatAgentSpecVLLM(engine=backend)
    messages = _history(3)
    model.invoke(messages)
    ((_, request),) = backend.requests
    assert model.get_num_tokens_from_messages(messages) == len(request.prompt_token_ids)
    assert model.get_token_ids("hello world") == tiny_tokenizer.encode(
        "hello world", add_special_tokens=False
    )
    text = render_chat_prompt(tiny_tokenizer, [{"role": "user", "content": "x"}], None)
    assert model.get_num_tokens(text) == len(tiny_tokenizer.encode(text, add_special_tokens=False))


def test_trim_messages_with_the_model_trims_offline() -> None:
    model = ChatAgentSpecVLLM()  # default model, no engine built: its tokenizer alone
    messages = _history(10)
    assert model.get_num_tokens("The quick brown fox") > 0
    total = model.get_num_tokens_from_messages(messages)
    assert total > 500
    kept = trim_messages(
        messages, max_tokens=200, token_counter=model, strategy="last", include_system=True
    )
    assert 1 < len(kept) < len(messages)
    assert model.get_num_tokens_from_messages(kept) <= 200
    assert model._backend is None  # counting started no engine


def test_custom_get_token_ids_is_honoured(tiny_tokenizer: Any) -> None:
    model = ChatAgentSpecVLLM(
        engine=FakeBackend(tiny_tokenizer, lambda _: "ok"),
        custom_get_token_ids=lambda text: [0] * len(text.split()),
    )
    assert model.get_token_ids("a b c") == [0, 0, 0]


def test_model_named_for_langsmith_and_metadata(tiny_tokenizer: Any) -> None:
    default = ChatAgentSpecVLLM()
    assert default._get_ls_params()["ls_model_name"] == DEFAULT_MODEL_NAME
    assert default._get_ls_params()["ls_provider"] == "vllm"
    backend = FakeBackend(tiny_tokenizer, lambda _: "ok")
    given = ChatAgentSpecVLLM(engine=backend)
    assert given.invoke("hi").response_metadata["model_name"] == "fake-engine"
    backend.model_name = f"/cache/agentspec_mw/models/{DEFAULT_MODEL_NAME}-0123456789ab"
    assert given.invoke("hi").response_metadata["model_name"] == DEFAULT_MODEL_NAME
    named = ChatAgentSpecVLLM(engine=backend, model="org/my-model")
    assert named._get_ls_params()["ls_model_name"] == "org/my-model"


@pytest.mark.parametrize(
    ("option", "value"), [("max_tokens", "a"), ("temperature", "warm"), ("top_p", [1])]
)
def test_non_numeric_call_option_is_named(tiny_tokenizer: Any, option: str, value: Any) -> None:
    model = ChatAgentSpecVLLM(engine=FakeBackend(tiny_tokenizer, lambda _: "ok"))
    with pytest.raises(ValueError, match=f"{option}="):
        model.invoke("hi", **{option: value})


def test_none_call_option_means_the_models_setting(tiny_tokenizer: Any) -> None:
    backend = FakeBackend(tiny_tokenizer, lambda _: "ok")
    model = ChatAgentSpecVLLM(engine=backend, max_tokens=7, temperature=0.5)
    model.invoke("hi", max_tokens=None, temperature=None, top_p=None)
    model.invoke("hi", max_tokens=None, max_completion_tokens=9)
    (_, first), (_, second) = backend.requests
    assert (first.max_tokens, first.temperature, first.top_p) == (7, 0.5, 1.0)
    assert second.max_tokens == 9
