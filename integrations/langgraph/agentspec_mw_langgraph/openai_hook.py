"""Tag the OpenAI-SDK requests of a wrapped graph to its vLLM server, with no change to
the model.

``with_agentspec(graph, engine="http://127.0.0.1:8000/v1")`` installs this hook (once per
process) and gives the graph's handler that server as its engine. From then on, while a
call of *that graph* is in progress, an OpenAI SDK client (any ``ChatOpenAI``, including
one built by ``create_agent("openai:...")``) whose ``base_url`` is the same server gets
the call's tags merged into the body of its ``POST .../completions`` and
``.../chat/completions`` requests as ``vllm_xargs``. Other clients, requests outside a
wrapped graph's calls, and graphs wrapped for another server are untouched -- the OpenAI
API itself rejects unknown body fields. The tagged requests also carry the call's routing
key header (``x-session-id``; :mod:`~agentspec_mw_langgraph.routing`) unless the client
already sets that header.

"The same server" compares :func:`server_key`\\ s: scheme, host (``localhost``,
``127.0.0.1``, ``[::1]`` and ``0.0.0.0`` are one host), port (default ports filled in) and
path without a trailing ``/`` or ``/v1``. A tagged call that sends a request to another
server gets a warning at its end, once per wrapped graph and server, naming the
``engine=`` to pass (see :class:`~agentspec_mw_langgraph.handler.AgentSpecCallbackHandler`).

This is a patch of a private function: ``openai._base_client.BaseClient._build_request
(self, options, ...)``, where ``options.json_data`` is the request body. Installation
checks that this hook point exists with that signature and raises
:class:`OpenAIHookError` otherwise (then use the public transports of
:mod:`agentspec_mw_langgraph.openai` instead); ``tests/langgraph/test_openai_hook.py``
is the contract test. A failure while rewriting one request sends it unchanged (a warning
and ``hook_stats().errors += 1``).

The responses of tagged requests are watched for the server's per-call speculation stats
(:mod:`~agentspec_mw_langgraph.spec_stats`; the handler puts them on the call's
``AIMessage``). That takes a second private hook point,
``SyncAPIClient._send_request(self, request, ...)`` and its async twin, which return the
``httpx`` response; where they are missing the tags still go, and the messages go without
the stats (``hook_stats().stats_hooked`` is ``False``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentspec_mw.errors import AgentSpecError
from agentspec_mw.tags import has_wire_tags
from agentspec_mw_langgraph.context import CallTicket, current_ticket, current_wire_tags
from agentspec_mw_langgraph.openai import InjectionStats
from agentspec_mw_langgraph.spec_stats import stats_reader, watch_response

__all__ = [
    "HookStats",
    "OpenAIHookError",
    "hook_stats",
    "install_openai_hook",
    "server_key",
]

_log = logging.getLogger(__name__)
_PATHS = ("/chat/completions", "/completions")
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_lock = threading.Lock()
_stats = InjectionStats()
_MARK = "__agentspec_hook__"
# tagged requests built and not yet sent -> their call's ticket (read by _send_request)
_pending: weakref.WeakKeyDictionary[Any, CallTicket] = weakref.WeakKeyDictionary()
_send_hooked = False


class OpenAIHookError(AgentSpecError, RuntimeError):
    """The installed OpenAI SDK lacks the request hook point this module patches."""


def server_key(url: object) -> str:
    """The normalised form of a server's base URL (see the module docstring).

    ``server_key("http://localhost:8000/v1/") == server_key("http://127.0.0.1:8000")``.

    Raises:
        ValueError: ``url`` is not an ``http(s)://host...`` URL.
    """
    text = str(url).strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a server URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(
            f"{text!r} is not a server URL: pass the vLLM server's OpenAI base URL, "
            "e.g. 'http://127.0.0.1:8000/v1'"
        )
    host = parts.hostname.lower()
    host = "localhost" if host in _LOCAL_HOSTS else host
    path = parts.path.rstrip("/")
    if path.lower().endswith("/v1"):
        path = path[:-3].rstrip("/")
    return f"{scheme}://{host}:{port or _DEFAULT_PORTS[scheme]}{path}"


@dataclass
class HookStats(InjectionStats):
    """:class:`~agentspec_mw_langgraph.openai.InjectionStats` of the hook, and whether it
    reads responses."""

    stats_hooked: bool = False
    """The response hook point exists: tagged calls get the server's speculation stats."""


def hook_stats() -> HookStats:
    """Counters of the hook (process-wide): ``injected`` requests got tags from it,
    ``untagged`` completion requests went without (no tagged call, or another server;
    requests that already carry tags, e.g. from ``AgentSpecMiddleware``, are not counted);
    ``stats_read``/``stats_errors``: responses of tagged requests whose speculation stats
    were recorded / could not be read."""
    with _lock:
        return HookStats(**vars(_stats), stats_hooked=_send_hooked)


def _count(field: str) -> None:
    with _lock:
        setattr(_stats, field, getattr(_stats, field) + 1)


def _merge(xargs: Any, wire: Mapping[str, Any]) -> dict[str, Any]:
    return {**wire, **(xargs if isinstance(xargs, Mapping) else {})}


def _carries_tags(options: Any) -> bool:
    for body in (options.json_data, options.extra_json):
        if isinstance(body, Mapping) and has_wire_tags(body.get("vllm_xargs")):
            return True
    return False


def _tagged_options(client: Any, options: Any) -> tuple[Any, CallTicket | None]:
    """The options to build the request from, and the call's ticket if they got its tags."""
    if str(getattr(options, "method", "")).lower() != "post":
        return options, None
    if not str(getattr(options, "url", "")).endswith(_PATHS):
        return options, None
    wire = current_wire_tags()
    ticket = current_ticket()
    if wire is None or ticket is None:  # not inside a wrapped graph's LLM call
        if not _carries_tags(options):  # AgentSpecMiddleware puts them in extra_body
            _count("untagged")
        return options, None
    base = str(getattr(client, "base_url", "")).rstrip("/")
    try:
        key = server_key(base)
    except ValueError:
        key = base
    if key != ticket.engine_url:
        ticket.mark_missed(key, base)
        _count("untagged")
        return options, None
    update: dict[str, Any] = {}
    body = options.json_data
    if isinstance(body, Mapping):
        update["json_data"] = {**body, "vllm_xargs": _merge(body.get("vllm_xargs"), wire)}
    extra = options.extra_json
    if isinstance(extra, Mapping) and "vllm_xargs" in extra:  # extra_body wins a shallow merge
        update["extra_json"] = {**extra, "vllm_xargs": _merge(extra["vllm_xargs"], wire)}
    if not update:
        raise ValueError(f"request body is {type(body).__name__}, not a JSON object")
    if ticket.headers:  # the routing key, unless the request or the client sets it
        given = options.headers if isinstance(options.headers, Mapping) else {}
        defaults = getattr(client, "default_headers", None)
        taken = {str(n).lower() for n in (*given, *(defaults or {}))}
        missing = {k: v for k, v in ticket.headers.items() if k.lower() not in taken}
        update["headers"] = {**given, **missing}
    tagged = options.model_copy(update=update)
    ticket.mark_delivered()
    _count("injected")
    return tagged, ticket


def _watch(request: Any, response: Any) -> None:
    """Read the stats of ``response`` if ``request`` was tagged (never raises)."""
    try:
        with _lock:
            ticket = _pending.pop(request, None)
    except TypeError:  # not weakly referenceable: never registered
        return
    if ticket is not None:
        watch_response(response, *stats_reader(ticket, _count))


def _hook_send(client_cls: Any, name: str) -> bool:
    """Wrap ``client_cls._send_request`` (sync or async) to read tagged responses; False
    if this SDK lacks it."""
    original: Callable[..., Any] | None = getattr(client_cls, "_send_request", None)
    if original is None:
        return False
    if getattr(original, _MARK, False):
        return True
    if list(inspect.signature(original).parameters)[:2] != ["self", "request"]:
        return False
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def _send_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            response = await original(self, request, *args, **kwargs)
            _watch(request, response)
            return response

    else:

        @functools.wraps(original)
        def _send_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            response = original(self, request, *args, **kwargs)
            _watch(request, response)
            return response

    setattr(_send_request, _MARK, True)
    client_cls._send_request = _send_request
    _log.debug("agentspec: reading speculation stats through %s._send_request", name)
    return True


def install_openai_hook() -> None:
    """Install the hook (idempotent; inert outside a wrapped graph's LLM calls).

    Raises:
        OpenAIHookError: the OpenAI SDK is missing or has no hook point (module docstring).
    """
    global _send_hooked
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
        ticket = None
        try:
            options, ticket = _tagged_options(self, options)
        except Exception as exc:  # noqa: BLE001 - never break the user's request
            _count("errors")
            _log.warning("agentspec: could not add tags to an OpenAI request: %s", exc)
        request = original(self, options, *args, **kwargs)
        if ticket is not None and _send_hooked:
            try:
                with _lock:
                    _pending[request] = ticket
            except TypeError:  # a request type without weak references: no stats
                pass
        return request

    setattr(_build_request, _MARK, True)
    with _lock:
        if not getattr(client_cls._build_request, _MARK, False):
            sync_ok = _hook_send(getattr(_base_client, "SyncAPIClient", None), "SyncAPIClient")
            async_ok = _hook_send(getattr(_base_client, "AsyncAPIClient", None), "AsyncAPIClient")
            _send_hooked = sync_ok and async_ok
            client_cls._build_request = _build_request
