"""Tool calling on ``agentspec serve`` for the default model (OpenAI ``tools``).

vLLM answers requests with ``tools`` (``tool_choice="auto"``, what ``create_agent`` and
``bind_tools`` send) only when started with ``--enable-auto-tool-choice`` and a
``--tool-call-parser``; and the model sees the tools only if its chat template renders
them. SmolLM2's own template drops them. For the default model ``agentspec serve``
therefore adds :func:`default_model_tool_args`:

* a chat template shipped with this package (``templates/smollm2_hermes_tools.jinja``)
  that offers the tools in the Hermes ``<tool_call>`` format -- the prompt the embedded
  chat model (``agentspec_mw_langgraph.toolformat``) builds;
* the ``agentspec_hermes`` tool parser (:mod:`agentspec_mw_vllm.tool_parser`, loaded with
  ``--tool-parser-plugin``): vLLM's ``hermes`` parser, except that a stream sends each
  call only once its block has closed, so streamed and non-streamed answers agree (a
  call cut off by ``max_tokens`` is content in both);
* ``--tool-strict-level parameter``: vLLM then constrains every call (``auto`` included)
  to the Hermes envelope and the tool's parameter schema, as if each tool had
  ``strict: true`` (at vLLM's default a tool without it gets arguments of any JSON, e.g.
  a list, which ``ChatOpenAI`` rejects);
* ``--exclude-tools-when-tool-choice-none``: with ``tool_choice="none"`` the prompt
  offers no tools (as the embedded chat model withholds them).

A model of your own keeps its template; pass its flags after ``--`` (docs/langgraph.md,
"create_agent with tools on agentspec serve").
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from agentspec_mw_vllm.vllm_args import option_name, passed_options

__all__ = [
    "DEFAULT_TOOL_CALL_PARSER",
    "TOOL_PARSER_PLUGIN",
    "TOOL_STRICT_LEVEL",
    "default_model_chat_template",
    "default_model_tool_args",
    "user_options",
]

#: The tool-call parser for the Hermes ``<tool_call>{json}</tool_call>`` format
#: (:mod:`agentspec_mw_vllm.tool_parser`, a subclass of vLLM's ``hermes`` parser).
DEFAULT_TOOL_CALL_PARSER = "agentspec_hermes"
#: The module ``--tool-parser-plugin`` imports to register :data:`DEFAULT_TOOL_CALL_PARSER`.
TOOL_PARSER_PLUGIN = "agentspec_mw_vllm.tool_parser"
#: ``--tool-strict-level``: argument schemas enforced as if every tool were strict.
TOOL_STRICT_LEVEL = "parameter"
_TEMPLATE = "smollm2_hermes_tools.jinja"

_AUTO = "--enable-auto-tool-choice"
_PARSER = "--tool-call-parser"
_PLUGIN = "--tool-parser-plugin"
_TEMPLATE_OPTION = "--chat-template"
_STRICT = "--tool-strict-level"
_EXCLUDE = "--exclude-tools-when-tool-choice-none"
#: Given by the user, any of these means their own tool-calling set-up: none of ours.
_SETUP_OPTIONS = frozenset({_AUTO, _PARSER, _PLUGIN, _TEMPLATE_OPTION})
#: The options this module reads among the user's; the booleans also as ``--no-...``.
_WATCHED = (_AUTO, _PARSER, _PLUGIN, _TEMPLATE_OPTION, _STRICT, _EXCLUDE)
_BOOLEAN_OPTIONS = frozenset({_AUTO, _EXCLUDE})


def default_model_chat_template() -> Path:
    """The path of the shipped chat template for the default model (tools included)."""
    path = Path(str(resources.files("agentspec_mw_vllm").joinpath("templates", _TEMPLATE)))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the agentspec-mw-vllm package is missing its chat template; "
            "reinstall it (pip install -e integrations/vllm)"
        )
    return path


def _spellings(option: str) -> tuple[str, ...]:
    return (option, f"--no-{option[2:]}") if option in _BOOLEAN_OPTIONS else (option,)


def _reads_as(arg: str) -> set[str]:
    """The tool-calling options (``_WATCHED``) that vLLM's parser may read ``arg`` as. It
    turns ``_`` into ``-`` in an option's name (the part before a ``=`` or ``.``) and
    takes a prefix of an option as that option (an error when the prefix fits several:
    the server does not start then anyway). No other vLLM option is a prefix of a watched
    one, so that is all (tests/vllm/test_tool_calling_review71.py checks every prefix
    against vLLM's parser)."""
    name = option_name(arg)
    if not name.startswith("--") or len(name) <= 2:
        return set()
    return {o for o in _WATCHED if any(s.startswith(name) for s in _spellings(o))}


def user_options(extra_args: Sequence[str]) -> set[str]:
    """The tool-calling options (``_WATCHED``) that ``extra_args`` (the user's vLLM
    arguments) set, in any spelling vLLM accepts (:func:`_reads_as`), directly or as keys
    of a ``--config`` YAML file they name (vLLM reads each key ``k`` as ``--k``). A
    ``--config`` file that cannot be read as a YAML mapping is skipped: vLLM refuses it
    when it starts."""
    passed = passed_options(extra_args, strict=False)
    return {option for name, _ in passed for option in _reads_as(name)}


def default_model_tool_args(extra_args: Sequence[str] = ()) -> list[str]:
    """The vLLM server arguments that enable tool calling for the default model.

    Empty when ``extra_args`` (the user's own vLLM arguments, :func:`user_options`) set
    any of ``--enable-auto-tool-choice``, ``--tool-call-parser``, ``--tool-parser-plugin``
    or ``--chat-template``: then the user chose, and theirs are used as given. A
    ``--tool-strict-level`` or ``--[no-]exclude-tools-when-tool-choice-none`` of the user
    replaces only ours.
    """
    given = user_options(extra_args)
    if given & _SETUP_OPTIONS:
        return []
    args = [
        _AUTO,
        _PARSER,
        DEFAULT_TOOL_CALL_PARSER,
        _TEMPLATE_OPTION,
        str(default_model_chat_template()),
        _PLUGIN,
        TOOL_PARSER_PLUGIN,
    ]
    if _STRICT not in given:
        args += [_STRICT, TOOL_STRICT_LEVEL]
    if _EXCLUDE not in given:
        args.append(_EXCLUDE)
    return args
