"""Review 71 of ``agentspec serve``'s tool calling for the default model.

* its vLLM arguments set ``--tool-strict-level parameter`` (every call's arguments held to
  the tool's schema, ``auto`` included) and ``--exclude-tools-when-tool-choice-none``,
  which vLLM's own parser reads as meant;
* the ``agentspec_hermes`` parser (``--tool-parser-plugin``) gives the same content and
  calls streaming and not streaming, however the output is cut into deltas; a call cut
  off by ``max_tokens`` is content in both;
* a tool-calling option of the user's is recognised in every spelling vLLM accepts
  (``_`` for ``-``, abbreviations, ``--no-...``, ``--config`` YAML keys);
* the shipped template renders the embedded model's prompt also for non-ASCII text and
  ``strict`` tools.

No server is started: vLLM's argument parser and its parser classes are driven directly.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentspec_mw_langgraph.toolformat import render_chat_prompt
from agentspec_mw_vllm.tool_calling import (
    _WATCHED,
    _spellings,
    default_model_chat_template,
    default_model_tool_args,
    user_options,
)

pytest.importorskip("vllm")

from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionRequest,
    ChatCompletionToolsParam,
)
from vllm.parser.parser_manager import ParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOLS = [ADD, WEATHER]


@pytest.fixture(scope="module")
def vllm_parser() -> argparse.ArgumentParser:
    """The argument parser of vLLM's OpenAI server (``api_server``)."""
    return make_arg_parser(FlexibleArgumentParser())


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    return parser.parse_args(["--model", "m", *args])


def _server_parser_class(args: list[str], parser: argparse.ArgumentParser) -> Any:
    """The composed vLLM parser class the server builds from ``args``, as its launcher
    does (the ``--tool-parser-plugin`` module imported first)."""
    ns = _parse(parser, args)
    if ns.tool_parser_plugin:
        importlib.import_module(ns.tool_parser_plugin)
    return ParserManager.get_parser(
        tool_parser_name=ns.tool_call_parser,
        enable_auto_tools=ns.enable_auto_tool_choice,
        tool_strict_level=ns.tool_strict_level,
    )


class _Tokenizer:
    """All a Hermes tool parser asks of a tokenizer here."""

    def get_vocab(self) -> dict[str, int]:
        return {}


def _request(**kw: Any) -> ChatCompletionRequest:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "What is 2+3?"}],
        "tools": TOOLS,
    }
    return ChatCompletionRequest(**{**body, **kw})


# -- items 1+2: argument schemas enforced; item 4: no tools with tool_choice "none" ------


def test_default_args_are_read_by_vllm_as_meant(vllm_parser: argparse.ArgumentParser) -> None:
    ns = _parse(vllm_parser, default_model_tool_args())
    assert ns.enable_auto_tool_choice is True
    assert ns.tool_strict_level == "parameter"
    assert ns.exclude_tools_when_tool_choice_none is True
    assert ns.chat_template == str(default_model_chat_template())
    importlib.import_module(ns.tool_parser_plugin)  # registers the parser it names
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    assert ns.tool_call_parser in ToolParserManager.list_registered()


@pytest.mark.parametrize("tool_choice", ["required", "named", "auto"])
def test_arguments_are_held_to_the_schema_of_a_tool_without_strict(
    vllm_parser: argparse.ArgumentParser, tool_choice: str
) -> None:
    """At vLLM's default strict level a tool without ``strict: true`` gets a grammar of
    any JSON for its arguments (a list passed: ``ChatOpenAI`` failed on it), and none at
    all under ``auto``."""
    choice: Any = tool_choice
    if tool_choice == "named":
        choice = {"type": "function", "function": {"name": "add"}}
    parser_cls = _server_parser_class(default_model_tool_args(), vllm_parser)
    request = _request(tool_choice=choice)
    request = parser_cls(_Tokenizer(), request.tools).adjust_request(request)
    assert request.structured_outputs is not None and request.structured_outputs.structural_tag
    tag = json.loads(request.structured_outputs.structural_tag)
    schemas = [t["content"]["json_schema"] for t in tag["format"]["tags"]]
    assert schemas and ADD["function"]["parameters"] in schemas  # type: ignore[index]
    assert all(isinstance(s, dict) and s.get("type") == "object" for s in schemas)


def test_user_strict_level_and_exclude_flag_replace_only_ours(
    vllm_parser: argparse.ArgumentParser,
) -> None:
    user = ["--tool_strict_level=function", "--no-exclude-tools"]
    args = default_model_tool_args(user)
    assert "--tool-strict-level" not in args
    assert "--exclude-tools-when-tool-choice-none" not in args
    assert "--enable-auto-tool-choice" in args and "--chat-template" in args
    ns = _parse(vllm_parser, args + user)
    assert ns.tool_strict_level == "function" and ns.exclude_tools_when_tool_choice_none is False


# -- item 3: streaming agrees with non-streaming -----------------------------------------

TC = '<tool_call>\n{{"name": "{}", "arguments": {}}}\n</tool_call>'
OUTPUTS = {
    "one call": TC.format("add", '{"a": 2, "b": 3}'),
    "two calls": TC.format("add", '{"a": 2, "b": 3}') + "\n" + TC.format("get_weather", "{}"),
    "text before and after": "Let me add.\n" + TC.format("add", '{"a": 1, "b": 2}') + "\nDone.",
    "compact": '<tool_call>{"name":"get_weather","arguments":{"city":"Z\\u00fcrich"}}</tool_call>',
    "non-ASCII and escapes": TC.format("get_weather", '{"city": "Zürich \\"x\\"\\nline"}'),
    "cut off by max_tokens": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b',
    "cut off in the closing tag": TC.format("add", '{"a": 2, "b": 3}')[:-5],
    "cut off after a call": TC.format("add", '{"a": 2, "b": 3}') + "\n<tool_call>\n{",
    "malformed JSON": '<tool_call>\n{"name": "add", "arguments": {"a": 2\n</tool_call>',
    "arguments a list": TC.format("add", "[2, 3]"),
    "arguments a JSON string": TC.format("get_weather", '"{\\"city\\": \\"Rome\\"}"'),
    "no arguments key": '<tool_call>\n{"name": "get_weather"}\n</tool_call>',
    "tag mentioned in prose": "I will use the <tool_call> tag now.",
    "plain text": "It is sunny in Paris.",
    "a < b": "a < b <tool_c",
    "only whitespace": " \n ",
}


def _split(text: str, sizes: Iterator[int]) -> list[str]:
    pieces, at = [], 0
    while at < len(text):
        n = next(sizes)
        pieces.append(text[at : at + n])
        at += n
    return pieces


def _chunkings(text: str) -> list[list[str]]:
    """Ways vLLM may deliver ``text``: whole, per character, in runs of 2, 3 and 7 (a
    speculative step), and cut at every single point."""
    out = [[text], list(text)]
    for n in (2, 3, 7):
        out.append(_split(text, iter(lambda n=n: n, None)))  # type: ignore[misc]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    return out


@pytest.fixture(scope="module")
def server_parser(vllm_parser: argparse.ArgumentParser) -> Any:
    """The parser class of a server started with ``default_model_tool_args()``."""
    return _server_parser_class(default_model_tool_args(), vllm_parser)


def _parser(cls: Any, **kw: Any) -> Any:
    request = _request(**kw)
    parser = cls(_Tokenizer(), request.tools)
    return parser, parser.adjust_request(request)


def _non_streaming(text: str, cls: Any, **kw: Any) -> Any:
    parser, request = _parser(cls, **kw)
    _, content, calls = parser.parse(text, request, enable_auto_tools=True)
    return (content or "").strip(), [(c.name, json.loads(c.arguments)) for c in calls or []]


def _streaming(pieces: list[str], cls: Any, **kw: Any) -> Any:
    """What a client assembles from the stream: vLLM's serving layer calls parse_delta
    per step, ``finished`` on the last."""
    parser, request = _parser(cls, **kw)
    content, calls = "", {}  # type: ignore[var-annotated]
    for i, piece in enumerate(pieces):
        delta = parser.parse_delta(
            piece, [0], request, prompt_token_ids=[1], finished=i == len(pieces) - 1
        )
        if delta is None:
            continue
        content += delta.content or ""
        for tc in delta.tool_calls:
            call = calls.setdefault(tc.index, {"name": "", "args": ""})
            call["name"] += (tc.function and tc.function.name) or ""
            call["args"] += (tc.function and tc.function.arguments) or ""
    return content.strip(), [(c["name"], json.loads(c["args"])) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_streaming_and_non_streaming_agree(server_parser: Any, name: str) -> None:
    text = OUTPUTS[name]
    expected = _non_streaming(text, server_parser)
    for pieces in _chunkings(text):
        assert _streaming(pieces, server_parser) == expected, pieces


def test_what_the_parser_makes_of_each_output(server_parser: Any) -> None:
    got = {name: _non_streaming(text, server_parser) for name, text in OUTPUTS.items()}
    add = ("add", {"a": 2, "b": 3})
    assert got["one call"] == ("", [add])
    assert got["two calls"] == ("", [add, ("get_weather", {})])
    assert got["text before and after"] == ("Let me add.\nDone.", [("add", {"a": 1, "b": 2})])
    assert got["compact"] == ("", [("get_weather", {"city": "Zürich"})])
    assert got["cut off in the closing tag"] == ("", [add])
    assert got["cut off after a call"] == ("<tool_call>\n{", [add])
    assert got["arguments a JSON string"] == ("", [("get_weather", {"city": "Rome"})])
    assert got["no arguments key"] == ("", [("get_weather", {})])
    for name in ("cut off by max_tokens", "malformed JSON", "arguments a list"):
        assert got[name] == (OUTPUTS[name], []), name  # content, never a call
    assert got["only whitespace"] == ("", [])


def test_a_call_cut_off_by_max_tokens_never_streams_as_a_call(
    server_parser: Any,
) -> None:
    text = OUTPUTS["cut off by max_tokens"]
    for pieces in _chunkings(text):
        assert _streaming(pieces, server_parser) == (text, []), pieces


@pytest.mark.parametrize("name", ["one call", "tag mentioned in prose", "malformed JSON"])
def test_tool_choice_none_is_all_content(server_parser: Any, name: str) -> None:
    text = OUTPUTS[name]
    assert _non_streaming(text, server_parser, tool_choice="none") == (text.strip(), [])
    for pieces in (_chunkings(text)[1], [text]):
        assert _streaming(pieces, server_parser, tool_choice="none") == (text.strip(), [])


# -- item 6: the user's options in any spelling vLLM accepts -----------------------------


@pytest.mark.parametrize(
    "user",
    [
        ["--tool_call_parser", "pythonic"],
        ["--tool-call-p", "pythonic"],
        ["--tool-call-parser=pythonic"],
        ["--chat_template=/my/t.jinja"],
        ["--enable_auto"],
        ["--no-enable-auto-tool-choice"],
        ["--tool-parser-plugin", "my.parsers"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_users_own_tool_calling_option_in_any_spelling_leaves_ours_out(
    user: list[str],
) -> None:
    assert default_model_tool_args(user) == []


def test_config_file_keys_count_as_the_users_options(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text("tool_call_parser: pythonic\nseed: 3\n", encoding="utf-8")
    assert default_model_tool_args(["--config", str(own)]) == []
    strict = tmp_path / "strict.yaml"
    strict.write_text("tool-strict-level: function\n", encoding="utf-8")
    args = default_model_tool_args(["--config", str(strict)])
    assert args and "--tool-strict-level" not in args and "--chat-template" in args
    unrelated = tmp_path / "other.yaml"
    unrelated.write_text("seed: 3\n", encoding="utf-8")
    assert default_model_tool_args(["--config", str(unrelated)]) == default_model_tool_args()
    # a file vLLM cannot read either: left to vLLM, which refuses it at start
    assert default_model_tool_args(["--config", str(tmp_path / "missing.yaml")])


def test_unrelated_options_keep_all_of_ours() -> None:
    args = default_model_tool_args()
    for user in (
        ["--seed", "3"],
        ["--chat-template-content-format", "string"],
        ["--tool-server", "x"],
    ):
        assert default_model_tool_args(user) == args


def _vllm_reads(parser: argparse.ArgumentParser, arg: str, option: str) -> str:
    """``"option"`` when vLLM's parser takes ``arg`` as (a spelling of) ``option``,
    ``"error"`` when it refuses ``arg`` (ambiguous), ``"other"`` otherwise."""
    action = next(a for a in parser._actions if option in a.option_strings)
    takes_value = action.nargs != 0
    value = "function" if option == "--tool-strict-level" else "x"
    probe = [arg, value] if takes_value else [arg]
    negative = arg.replace("_", "-").startswith("--no-")
    # a boolean's negative spelling is seen when it undoes the positive one
    before = [option] if negative and not takes_value else []
    try:
        ns = _parse(parser, before + probe)
    except SystemExit:
        return "error"
    got = getattr(ns, action.dest)
    if takes_value:
        return "option" if got == value else "other"
    return "option" if got is (not negative) else "other"


def test_every_prefix_of_a_watched_option_is_judged_as_vllm_reads_it(
    vllm_parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    """For every spelling vLLM could take as a watched option (each prefix of it, with
    ``-`` or ``_``): ours are left out exactly when vLLM reads it as that option or
    refuses it (an ambiguous prefix: the server does not start anyway)."""
    for option in _WATCHED:
        for spelling in _spellings(option):
            assert spelling in vllm_parser._option_string_actions, spelling
            for end in range(3, len(spelling) + 1):
                prefix = spelling[:end]
                for arg in {prefix, "--" + prefix[2:].replace("-", "_")}:
                    reads = _vllm_reads(vllm_parser, arg, option)
                    assert reads != "other", (arg, option)  # no other option shadows it
                    assert option in user_options([arg]), (arg, reads)
    capsys.readouterr()  # argparse's messages for the ambiguous prefixes


# -- item 7: the template renders the embedded prompt ------------------------------------


def test_template_matches_the_embedded_prompt_with_non_ascii_and_strict(
    tiny_tokenizer: Any,
) -> None:
    own, shipped = copy.deepcopy(tiny_tokenizer), copy.deepcopy(tiny_tokenizer)
    own.chat_template = (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    shipped.chat_template = default_model_chat_template().read_text(encoding="utf-8")
    tools = [  # as LangChain's convert_to_openai_tool writes them
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Météo d'une ville",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
    ]
    args = json.dumps({"city": "Zürich"}, ensure_ascii=False)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    messages = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "12C"},
    ]
    embedded = render_chat_prompt(own, messages, tools)
    # what vLLM hands the template: its tool models dumped, call arguments parsed
    sent_tools = [ChatCompletionToolsParam.model_validate(t).model_dump() for t in tools]
    sent = copy.deepcopy(messages)
    sent[1]["tool_calls"][0]["function"]["arguments"] = json.loads(args)  # type: ignore[index]
    served = shipped.apply_chat_template(
        sent, tools=sent_tools, tokenize=False, add_generation_prompt=True
    )
    assert "M\\u00e9t\\u00e9o" in embedded and '"strict": true' in embedded
    assert "Z\\u00fcrich" in embedded
    assert served == embedded
