"""``agentspec serve``'s tool calling for the default model: the shipped chat template
renders exactly the prompt the embedded chat model builds (``toolformat``), so a
``ChatOpenAI`` agent on the server sees the same tools prompt as ``ChatAgentSpecVLLM``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agentspec_mw_langgraph.toolformat import render_chat_prompt
from agentspec_mw_vllm.tool_calling import default_model_chat_template, default_model_tool_args

# SmolLM2-135M-Instruct's own chat template (from its tokenizer_config.json): no tools.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


def _call(city: str, call_id: str) -> dict[str, Any]:
    args = json.dumps({"city": city})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
    }


CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is the weather in Paris?"}],
    "system": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Rome and Oslo?"},
    ],
    "history": [
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("Rome", "c1")]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": "It is sunny in Rome."},
        {"role": "user", "content": "And in Oslo and Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [_call("Oslo", "c2"), _call("Paris", "c3")],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "c2"},
        {"role": "tool", "content": "snow", "tool_call_id": "c3"},
    ],
}


def _as_vllm_sends(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM hands the template tool-call arguments parsed into dicts."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or ():
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


@pytest.fixture()
def tokenizers(tiny_tokenizer: Any) -> tuple[Any, Any]:
    own, shipped = copy.deepcopy(tiny_tokenizer), copy.deepcopy(tiny_tokenizer)
    own.chat_template = SMOLLM2_TEMPLATE
    shipped.chat_template = default_model_chat_template().read_text()
    return own, shipped


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [[WEATHER], [WEATHER, CLOCK]], ids=["one-tool", "two-tools"])
@pytest.mark.parametrize("parsed_args", [True, False], ids=["vllm-dict-args", "string-args"])
def test_shipped_template_renders_the_embedded_tools_prompt(
    tokenizers: tuple[Any, Any], name: str, tools: list[dict[str, Any]], parsed_args: bool
) -> None:
    own, shipped = tokenizers
    messages = CONVERSATIONS[name]
    embedded = render_chat_prompt(own, messages, tools)
    sent = _as_vllm_sends(messages) if parsed_args else messages
    served = shipped.apply_chat_template(
        sent, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert "<tools>" in embedded and "get_weather" in embedded
    assert served == embedded


@pytest.mark.parametrize("name", ["user", "system"])
def test_without_tools_it_is_smollm2s_own_template(tokenizers: tuple[Any, Any], name: str) -> None:
    own, shipped = tokenizers
    messages = CONVERSATIONS[name]
    expected = own.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        shipped.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        == expected
    )
    assert render_chat_prompt(own, messages, None) == expected


def test_tool_args_enable_the_hermes_parser_unless_the_user_chose() -> None:
    args = default_model_tool_args()
    assert args[:3] == ["--enable-auto-tool-choice", "--tool-call-parser", "agentspec_hermes"]
    assert args[3] == "--chat-template" and args[4].endswith(".jinja")
    assert default_model_tool_args(["--seed", "3"]) == args
    assert default_model_tool_args(["--tool-call-parser", "llama3_json"]) == []
    assert default_model_tool_args(["--chat-template=/my/t.jinja"]) == []
