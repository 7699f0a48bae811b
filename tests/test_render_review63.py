"""Review 63: tool-call ``arguments`` reach a tool-aware chat template as vLLM hands them
over (``_postprocess_messages``: the JSON string parsed to a dict), on a copy; templates
that do not render ``tool_calls`` keep the raw-string fold, so shipped prompts are
unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentspec_mw.traces import render
from agentspec_mw.traces.render import RENDER_VERSION, render_prompt_text
from agentspec_mw.traces.schema import Message

#: The tool-call part of Qwen2.5-Instruct's official template (Llama-3.1's does the same
#: ``| tojson``), plus a marker for an assistant message that reaches the tool path.
TOOL_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls is defined %}{{- '[calls]' }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SHIPPED_QWEN = Path(__file__).resolve().parents[2] / "shared" / "tokenizers" / "qwen2.5"


def _call(arguments: Any, name: str = "get_user_details", **extra: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
        **extra,
    }


def _msgs(*calls: dict[str, Any]) -> list[dict[str, Any]]:
    """As in ``shared/traces/tau_bench_airline.jsonl.xz``."""
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": list(calls)},
        {"role": "tool", "content": "{}", "tool_call_id": "c1"},
    ]


@pytest.fixture()
def tool_tokenizer(tiny_tokenizer_dir: Path):  # type: ignore[no-untyped-def]
    """A fresh tokenizer (the session one is shared) with the tool-aware template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_arguments_reach_a_tojson_template_as_an_object(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = [Message(**m) for m in _msgs(_call('{"user_id":"mia_li_3668"}'))]
    text = render_prompt_text(prompt, tool_tokenizer)
    assert '{"name": "get_user_details", "arguments": {"user_id": "mia_li_3668"}}' in text
    assert '"{\\"user_id\\"' not in text  # not an escaped string literal


def test_the_traces_messages_are_not_mutated(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prompt = [Message(**m) for m in _msgs(_call('{"a": 1}'), _call({"b": 2}))]
    before = copy.deepcopy([m.model_dump() for m in prompt])
    render_prompt_text(prompt, tool_tokenizer)
    assert [m.model_dump() for m in prompt] == before
    assert prompt[1].tool_calls[0]["function"]["arguments"] == '{"a": 1}'  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"x": [1, 2]}', {"x": [1, 2]}),
        ({"x": 1}, {"x": 1}),
        ("not json", {}),  # vLLM: a warning, then {} so the conversation goes on
        ("[1, 2]", {}),  # valid JSON, not an object
        ("42", {}),
        ("", {}),
        (None, {}),
        ([1], {}),
    ],
)
def test_arguments_are_coerced_as_vllm_does(  # type: ignore[no-untyped-def]
    tool_tokenizer, arguments: Any, expected: dict[str, Any]
) -> None:
    text = render_prompt_text([Message(**m) for m in _msgs(_call(arguments))], tool_tokenizer)
    assert f'"arguments": {json.dumps(expected)}}}' in text
    msgs = _msgs(_call(arguments))
    call = render._parse_tool_call_arguments(msgs)[1]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {**call["function"]}}
    assert call["function"] == {"name": "get_user_details", "arguments": expected}
    assert msgs == _msgs(_call(arguments))  # the input is left as it was


def test_an_empty_tool_calls_list_is_dropped(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = _msgs()
    assert "tool_calls" not in render._parse_tool_call_arguments(msgs)[1]
    assert msgs[1]["tool_calls"] == []
    text = render_prompt_text([Message(**m) for m in msgs], tool_tokenizer)
    assert "[calls]" not in text


def test_entries_vllm_refuses_pass_through_unchanged() -> None:
    odd = [
        {"role": "assistant", "tool_calls": ["x"]},
        {"role": "assistant", "tool_calls": [{"type": "custom", "function": {"arguments": "{}"}}]},
        {"role": "assistant", "tool_calls": [{"name": "f", "arguments": "{}"}]},
        {"role": "user", "tool_calls": [_call("{}")]},  # only assistant messages
    ]
    assert render._parse_tool_call_arguments(copy.deepcopy(odd)) == odd


def test_same_text_as_vllms_chat_path(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    chat_utils = pytest.importorskip("vllm.renderers.chat_utils")
    cases = [
        _msgs(_call('{"user_id":"mia_li_3668"}'), _call('{"n": 2, "l": ["é"]}', name="g")),
        _msgs(_call("not json")),
        _msgs(_call("[1]")),
        _msgs(_call("")),
        _msgs(_call({"x": 1})),
        _msgs(),
    ]
    for msgs in cases:
        ours = render_prompt_text([Message(**m) for m in msgs], tool_tokenizer)
        theirs = copy.deepcopy(msgs)
        chat_utils._postprocess_messages(theirs)
        for m in theirs:  # vLLM's parser drops None content before the template
            if m.get("content") is None:
                m["content"] = ""
        vllm_text = tool_tokenizer.apply_chat_template(
            theirs, tokenize=False, add_generation_prompt=True
        )
        assert ours == vllm_text, msgs


def test_templates_without_tool_calls_keep_the_raw_fold(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    raw = '{"user_id":"mia_li_3668", "bad": }'  # kept exactly, even unparsable
    prompt = [Message(**m) for m in _msgs(_call(raw))]
    text = render_prompt_text(prompt, tiny_tokenizer)
    assert f'{{"name": "get_user_details", "arguments": {raw}}}' in text


def test_a_failing_tool_aware_template_falls_back_with_raw_arguments(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tool_tokenizer.chat_template = "{# tool_calls #}{{ raise_exception('no') }}"
    raw = '{"user_id":"mia_li_3668"}'
    text = render_prompt_text([Message(**m) for m in _msgs(_call(raw))], tool_tokenizer)
    assert text.startswith("<|user|>\nhi\n")
    assert f'{{"name": "get_user_details", "arguments": {raw}}}' in text


def test_render_version_bumped_so_cached_tokens_are_redone(tool_tokenizer) -> None:  # type: ignore[no-untyped-def]
    from agentspec_mw.traces import tokenized

    assert RENDER_VERSION >= 3
    now = tokenized.tokenizer_fingerprint(tool_tokenizer)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tokenized, "RENDER_VERSION", 2)
        assert tokenized.tokenizer_fingerprint(tool_tokenizer) != now


@pytest.mark.skipif(not SHIPPED_QWEN.is_dir(), reason="../shared/tokenizers/qwen2.5 absent")
def test_shipped_qwen_template_takes_the_fold_path() -> None:
    """Its simplified template does not render ``tool_calls``: the raw-string fold, as
    before the fix, so shipped replays' prompt tokens do not change."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SHIPPED_QWEN)
    assert "tool_calls" not in str(tok.chat_template)
    raw = '{"user_id":"mia_li_3668"}'
    text = render_prompt_text([Message(**m) for m in _msgs(_call(raw))], tok)
    line = json.dumps("get_user_details")
    assert f'<|im_start|>assistant\n{{"name": {line}, "arguments": {raw}}}<|im_end|>' in text
