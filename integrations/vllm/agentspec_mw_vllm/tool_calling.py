"""Tool calling on ``agentspec serve`` for the default model (OpenAI ``tools``).

vLLM answers requests with ``tools`` (``tool_choice="auto"``, what ``create_agent`` and
``bind_tools`` send) only when started with ``--enable-auto-tool-choice`` and a
``--tool-call-parser``; and the model sees the tools only if its chat template renders
them. SmolLM2's own template drops them. For the default model ``agentspec serve``
therefore adds :func:`default_model_tool_args`: the ``hermes`` parser and a chat template
shipped with this package (``templates/smollm2_hermes_tools.jinja``) that offers the
tools in the Hermes ``<tool_call>`` format -- the same prompt the embedded chat model
(``agentspec_mw_langgraph.toolformat``) builds. A model of your own keeps its template;
pass its flags after ``--`` (docs/langgraph.md, "create_agent with tools on agentspec serve").
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

__all__ = ["DEFAULT_TOOL_CALL_PARSER", "default_model_chat_template", "default_model_tool_args"]

#: vLLM's tool-call parser for the Hermes ``<tool_call>{json}</tool_call>`` format.
DEFAULT_TOOL_CALL_PARSER = "hermes"
_TEMPLATE = "smollm2_hermes_tools.jinja"
_TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "--chat-template")


def default_model_chat_template() -> Path:
    """The path of the shipped chat template for the default model (tools included)."""
    path = Path(str(resources.files("agentspec_mw_vllm").joinpath("templates", _TEMPLATE)))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the agentspec-mw-vllm package is missing its chat template; "
            "reinstall it (pip install -e integrations/vllm)"
        )
    return path


def default_model_tool_args(extra_args: Sequence[str] = ()) -> list[str]:
    """The vLLM server arguments that enable tool calling for the default model.

    Empty when ``extra_args`` (the user's own vLLM arguments) already set any of
    ``--enable-auto-tool-choice``, ``--tool-call-parser`` or ``--chat-template``: then the
    user chose, and theirs are used as given.
    """
    if any(arg.split("=", 1)[0] in _TOOL_FLAGS for arg in extra_args):
        return []
    return [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        DEFAULT_TOOL_CALL_PARSER,
        "--chat-template",
        str(default_model_chat_template()),
    ]
