"""vLLM tool parser ``agentspec_hermes``: Hermes ``<tool_call>`` blocks, streamed as they close.

``agentspec serve`` uses it for the default model (``--tool-parser-plugin
agentspec_mw_vllm.tool_parser --tool-call-parser agentspec_hermes``;
:mod:`agentspec_mw_vllm.tool_calling`). It reads the same format as vLLM's ``hermes``
parser, but streaming and non-streaming responses agree, because both run one splitter
(:class:`BlockSplitter`) that decides each piece of the output only from the text up to it:

* a ``<tool_call>`` block ends at the first ``</tool_call>`` after it. A block whose body
  is a JSON object with a string ``name`` and object ``arguments`` (``parameters`` is
  read too, a JSON string holding an object is decoded, and a ``name``-only call gets
  ``{}``: as ``agentspec_mw_langgraph.toolformat`` parses the embedded model's output) is
  a tool call; any other block stays in the content, as the model wrote it;
* a stream sends a call whole (name and arguments in one delta) once its block has
  closed, never its arguments piece by piece: a call cut off by ``max_tokens`` or a stop
  string is never sent as a call. At the end of the output an unclosed block is a call
  only when its body is already a complete call (the output stopped inside
  ``</tool_call>``); otherwise it is content, in both modes (vLLM's ``hermes`` parser
  streams such a block as a call with truncated arguments but returns it as text when not
  streaming);
* the text around the blocks is the content (the whitespace right after a call is
  dropped); content that is only whitespace is none;
* with ``tool_choice="none"`` the output is all content, unparsed.

vLLM's streaming serving layer calls :meth:`AgentSpecHermesToolParser.finish_streaming`
at the end of the output for parsers marked ``engine_based_streaming`` (as for vLLM's own
``k2_horizon`` parser), which is how the text held back for an unclosed block gets out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import Tool, ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.tool_parsers.utils import partial_tag_overlap

__all__ = ["PARSER_NAME", "AgentSpecHermesToolParser", "BlockSplitter", "parse_call"]

#: The name ``--tool-call-parser`` selects this parser by (registered on import).
PARSER_NAME = "agentspec_hermes"

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_call(body: str) -> tuple[str, str] | None:
    """The ``(name, arguments JSON)`` of a ``<tool_call>`` block's body, or ``None`` when
    the body is not a call (see the module docstring)."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return None
    if "arguments" in data:
        args = data["arguments"]
    elif "parameters" in data:
        args = data["parameters"]
    elif len(data) == 1:
        args = {}
    else:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args, parse_constant=_no_constant)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return data["name"], json.dumps(args, ensure_ascii=False)


class BlockSplitter:
    """Splits model output, fed in pieces, into content and tool calls.

    :meth:`feed` returns only what the text so far decides (it holds back a suffix that
    may start a ``<tool_call>``, an open block, whitespace after a call and, until some
    other content comes, whitespace-only content); :meth:`finish` returns the rest. So
    the pieces add up to the same content and calls however the output is cut up.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_block = False
        self._after_call = False
        self._held = ""  # whitespace-only content, sent once other content comes
        self._content_seen = False

    def feed(self, text: str) -> tuple[str, list[tuple[str, str]]]:
        """Add ``text``; return the content and calls it decides."""
        self._buf += text
        content: list[str] = []
        calls: list[tuple[str, str]] = []
        while True:
            if self._in_block:
                end = self._buf.find(_CLOSE, len(_OPEN))
                if end < 0:
                    break
                end += len(_CLOSE)
                block, self._buf = self._buf[:end], self._buf[end:]
                self._in_block = False
                call = parse_call(block[len(_OPEN) : -len(_CLOSE)])
                if call is None:
                    content.append(block)
                else:
                    calls.append(call)
                    self._after_call = True
                continue
            if self._after_call:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._after_call = False
            start = self._buf.find(_OPEN)
            if start >= 0:
                content.append(self._buf[:start])
                self._buf = self._buf[start:]
                self._in_block = True
                continue
            cut = len(self._buf) - partial_tag_overlap(self._buf, _OPEN)
            content.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return self._content("".join(content)), calls

    def finish(self) -> tuple[str, list[tuple[str, str]]]:
        """End of the output: return the content and calls still held back."""
        rest, self._buf = self._buf, ""
        calls: list[tuple[str, str]] = []
        if self._in_block:
            self._in_block = False
            body = rest[len(_OPEN) :]
            call = parse_call(body[: len(body) - partial_tag_overlap(body, _CLOSE)])
            if call is not None:
                calls.append(call)
                rest = ""
        content = self._content(rest)
        self._held = ""  # only whitespace: no content
        return content, calls

    def _content(self, text: str) -> str:
        if self._content_seen:
            return text
        self._held += text
        if not self._held.strip():
            return ""
        self._content_seen = True
        text, self._held = self._held, ""
        return text


class AgentSpecHermesToolParser(Hermes2ProToolParser):
    """vLLM's ``hermes`` parser with :class:`BlockSplitter`'s rules (module docstring).

    Keeps the ``hermes`` structural tags (``--tool-strict-level``) and request
    adjustment."""

    # vLLM then feeds only the new text of each step and calls finish_streaming() at the
    # end (vllm.parser.abstract_parser.Parser._flush_engine_parsers).
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, tools: list[Tool] | None = None) -> None:
        super().__init__(tokenizer, tools)
        self._splitter = BlockSplitter()

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        if request.tool_choice == "none":
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        splitter = BlockSplitter()
        content, calls = splitter.feed(model_output)
        rest, more = splitter.finish()
        tool_calls = [
            ToolCall(function=FunctionCall(name=name, arguments=args))
            for name, args in calls + more
        ]
        return ExtractedToolCallInformation(
            tools_called=bool(tool_calls), tool_calls=tool_calls, content=(content + rest) or None
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        if request.tool_choice == "none":
            return DeltaMessage(content=delta_text) if delta_text else None
        return self._delta(*self._splitter.feed(delta_text))

    def finish_streaming(self) -> DeltaMessage | None:
        """The content and calls held back until the end of the output."""
        return self._delta(*self._splitter.finish())

    def _delta(self, content: str, calls: list[tuple[str, str]]) -> DeltaMessage | None:
        deltas = []
        for name, args in calls:
            index = len(self.prev_tool_call_arr)
            # what vLLM's finalize step compares: all arguments already sent
            self.prev_tool_call_arr.append({"name": name, "arguments": args})
            self.streamed_args_for_tool.append(args)
            deltas.append(
                DeltaToolCall(
                    index=index,
                    id=make_tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=name, arguments=args),
                )
            )
        if not content and not deltas:
            return None
        return DeltaMessage(content=content or None, tool_calls=deltas)


ToolParserManager.register_module(PARSER_NAME, module=AgentSpecHermesToolParser)
