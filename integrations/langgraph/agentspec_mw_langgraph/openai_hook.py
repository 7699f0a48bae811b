"""Tag every OpenAI-SDK request to a registered vLLM server, with no change to the model.

``with_agentspec(graph, engine="http://127.0.0.1:8000/v1")`` calls
:func:`enable_openai_injection` for that base URL. From then on, any OpenAI SDK client in
this process (so any ``ChatOpenAI``, including one built by ``create_agent("openai:...")``)
whose ``base_url`` is a registered one gets the current call's tags merged into the body
of its ``POST .../completions`` and ``.../chat/completions`` requests as ``vllm_xargs``.
Requests to other endpoints (the OpenAI API itself, which rejects unknown body fields)
and calls without tags are untouched.

This is a patch of a private function: ``openai._base_client.BaseClient._build_request
(self, options, ...)``, where ``options.json_data`` is the request body. Installation
checks that this hook point exists with that signature and raises
:class:`OpenAIHookError` otherwise (then use the public transports of
:mod:`agentspec_mw_langgraph.openai` instead); ``tests/langgraph/test_openai_hook.py``
is the contract test. A failure while rewriting one request sends it unchanged (a warning
and ``hook_stats().errors += 1``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_langgraph.context import current_wire_tags
from agentspec_mw_langgraph.openai import InjectionStats

__all__ = [
    "OpenAIHookError",
    "disable_openai_injection",
    "enable_openai_injection",
    "hook_stats",
    "injected_base_urls",
]

_log = logging.getLogger(__name__)
_PATHS = ("/chat/completions", "/completions")
_lock = threading.Lock()
_bases: set[str] = set()
_stats = InjectionStats()
_MARK = "__agentspec_hook__"


class OpenAIHookError(AgentSpecError, RuntimeError):
    """The installed OpenAI SDK lacks the request hook point this module patches."""


def _normalize(url: object) -> str:
    return str(url).rstrip("/")


def enable_openai_injection(base_url: str) -> None:
    """Tag OpenAI-SDK requests to ``base_url`` (installs the hook once).

    Raises:
        ValueError: ``base_url`` is not an ``http(s)://`` URL.
        OpenAIHookError: the OpenAI SDK has no hook point (see the module docstring).
    """
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"engine={base_url!r}: a server must be an http(s):// base URL")
    _install()
    with _lock:
        _bases.add(_normalize(base_url))


def disable_openai_injection(base_url: str | None = None) -> None:
    """Stop tagging requests to ``base_url`` (``None``: to every URL). The hook stays."""
    with _lock:
        if base_url is None:
            _bases.clear()
        else:
            _bases.discard(_normalize(base_url))


def injected_base_urls() -> frozenset[str]:
    """The base URLs whose requests get tags."""
    with _lock:
        return frozenset(_bases)


def hook_stats() -> InjectionStats:
    """Counters of the hook (process-wide)."""
    with _lock:
        return InjectionStats(_stats.injected, _stats.untagged, _stats.errors)


def _count(field: str) -> None:
    with _lock:
        setattr(_stats, field, getattr(_stats, field) + 1)


def _merge(xargs: Any, wire: Mapping[str, Any]) -> dict[str, Any]:
    return {**wire, **(xargs if isinstance(xargs, Mapping) else {})}


def _tagged_options(client: Any, options: Any) -> Any:
    if str(getattr(options, "method", "")).lower() != "post":
        return options
    if not str(getattr(options, "url", "")).endswith(_PATHS):
        return options
    with _lock:
        registered = _normalize(getattr(client, "base_url", "")) in _bases
    if not registered:
        return options
    wire = current_wire_tags()
    if wire is None:
        _count("untagged")
        return options
    update: dict[str, Any] = {}
    body = options.json_data
    if isinstance(body, Mapping):
        update["json_data"] = {**body, "vllm_xargs": _merge(body.get("vllm_xargs"), wire)}
    extra = options.extra_json
    if isinstance(extra, Mapping) and "vllm_xargs" in extra:  # extra_body wins a shallow merge
        update["extra_json"] = {**extra, "vllm_xargs": _merge(extra["vllm_xargs"], wire)}
    if not update:
        raise ValueError(f"request body is {type(body).__name__}, not a JSON object")
    _count("injected")
    return options.model_copy(update=update)


def _install() -> None:
    try:
        from openai import _base_client
    except ImportError as exc:
        raise OpenAIHookError(
            "tagging OpenAI-SDK requests needs the 'openai' package: "
            "pip install 'agentspec-mw-langgraph[openai]'"
        ) from exc
    client_cls = getattr(_base_client, "BaseClient", None)
    original: Callable[..., Any] | None = getattr(client_cls, "_build_request", None)
    if client_cls is None or original is None:
        raise OpenAIHookError(
            "this OpenAI SDK has no BaseClient._build_request to hook; build the model "
            "with agentspec_mw_langgraph.openai.agentspec_chat_openai(...) instead"
        )
    if getattr(original, _MARK, False):
        return
    params = list(inspect.signature(original).parameters)
    if params[:2] != ["self", "options"]:
        raise OpenAIHookError(
            f"BaseClient._build_request{inspect.signature(original)} is not "
            "(self, options, ...); build the model with agentspec_chat_openai(...) instead"
        )

    @functools.wraps(original)
    def _build_request(self: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            options = _tagged_options(self, options)
        except Exception as exc:  # noqa: BLE001 - never break the user's request
            _count("errors")
            _log.warning("agentspec: could not add tags to an OpenAI request: %s", exc)
        return original(self, options, *args, **kwargs)

    setattr(_build_request, _MARK, True)
    with _lock:
        if not getattr(client_cls._build_request, _MARK, False):
            client_cls._build_request = _build_request
