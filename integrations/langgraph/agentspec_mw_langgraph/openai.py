"""Remote vLLM server: put the current call's tags into OpenAI-API requests as ``vllm_xargs``.

The inline handler sets the tags of each LLM call in a ContextVar just before the call;
the httpx transports here read it when the OpenAI client sends the request, and merge
the flat wire tags into the JSON body's ``vllm_xargs`` (keys the caller already put there
win). vLLM hands ``vllm_xargs`` to the proposer as the request's ``extra_args``. Node code
does not change -- only how the ``ChatOpenAI`` model is constructed::

    from agentspec_mw_langgraph.openai import agentspec_chat_openai
    llm = agentspec_chat_openai(model="Qwen/Qwen2.5-7B-Instruct", base_url=URL, api_key="x")

or, for an existing constructor call, ``http_client``/``http_async_client`` from
:func:`agentspec_http_clients`. Only ``POST .../completions`` and ``.../chat/completions``
requests with a JSON object body are touched; anything else, or a call without tags,
passes through unchanged. These transports tag whatever server the client talks to (the
client is built for it); ``with_agentspec(graph, engine=URL)`` tags plain clients instead
(:mod:`~agentspec_mw_langgraph.openai_hook`). A failure to rewrite a request sends it as
it was (a warning and ``InjectionStats.errors += 1``); a server that cannot be reached
raises httpx's ``ConnectError`` naming its URL (the OpenAI SDK's ``Connection error.``
carries it as its cause).

The transports also read the server's per-call speculation stats from the responses of
tagged requests (:mod:`~agentspec_mw_langgraph.spec_stats`), which the handler puts on the
call's ``AIMessage`` as ``response_metadata["speculative_decoding"]``.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

import httpx

from agentspec_mw.errors import MissingDependencyError
from agentspec_mw_langgraph.context import CallTicket, current_ticket, current_wire_tags
from agentspec_mw_langgraph.spec_stats import stats_reader, watch_response

__all__ = [
    "AgentSpecAsyncTransport",
    "AgentSpecTransport",
    "InjectionStats",
    "agentspec_chat_openai",
    "agentspec_http_clients",
    "inject_tags",
]

_log = logging.getLogger(__name__)
_PATHS = ("/chat/completions", "/completions")


@dataclass
class InjectionStats:
    """Counters of one transport."""

    injected: int = 0
    """Requests that got tags."""
    untagged: int = 0
    """Completion requests sent while no call was tagged."""
    errors: int = 0
    """Requests that could not be rewritten (sent unchanged)."""
    stats_read: int = 0
    """Responses whose speculation stats were recorded for their call."""
    stats_errors: int = 0
    """Responses whose speculation stats could not be read (the call goes without)."""


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = InjectionStats()

    def add(self, field: str) -> None:
        with self._lock:
            setattr(self._stats, field, getattr(self._stats, field) + 1)

    def snapshot(self) -> InjectionStats:
        with self._lock:
            return replace(self._stats)


def inject_tags(request: httpx.Request) -> httpx.Request | None:
    """A copy of ``request`` with the current tags in ``vllm_xargs``; ``None`` if not tagged.

    The call's :class:`~agentspec_mw_langgraph.context.CallTicket` records the delivery;
    its headers (the routing key) are added where the request does not set them.

    Raises:
        ValueError: the body is not a JSON object.
    """
    wire = current_wire_tags()
    if wire is None:
        return None
    body = json.loads(request.read())
    if not isinstance(body, dict):
        raise ValueError("request body is not a JSON object")
    xargs = body.get("vllm_xargs")
    body["vllm_xargs"] = {**wire, **(xargs if isinstance(xargs, dict) else {})}
    content = json.dumps(body).encode()
    headers = request.headers.copy()
    headers["content-length"] = str(len(content))
    ticket = current_ticket()
    if ticket is not None:
        for name, value in ticket.headers.items():  # the routing key; the client's wins
            headers.setdefault(name, value)
        ticket.mark_delivered()
    return httpx.Request(
        request.method,
        request.url,
        headers=headers,
        content=content,
        extensions=request.extensions,
    )


def _is_completion(request: httpx.Request) -> bool:
    return request.method == "POST" and request.url.path.endswith(_PATHS)


def _rewrite(request: httpx.Request, counter: _Counter) -> tuple[httpx.Request, CallTicket | None]:
    """The request to send, and the ticket of its call when it got the call's tags."""
    if not _is_completion(request):
        return request, None
    try:
        tagged = inject_tags(request)
    except Exception as exc:  # noqa: BLE001 - never break the user's request
        counter.add("errors")
        _log.warning("agentspec: could not add tags to %s: %s", request.url, exc)
        return request, None
    counter.add("untagged" if tagged is None else "injected")
    return (request, None) if tagged is None else (tagged, current_ticket())


def _unreachable(request: httpx.Request, exc: httpx.ConnectError) -> httpx.ConnectError:
    """``exc`` naming the server it could not reach (httpx's says only, e.g., "[Errno 111]
    Connection refused", and the OpenAI SDK's "Connection error." above it names nothing)."""
    return httpx.ConnectError(
        f"cannot reach the server at {request.url} ({exc}); is the vLLM server running "
        "and is base_url right?",
        request=request,
    )


def _watch(response: httpx.Response, ticket: CallTicket | None, counter: _Counter) -> None:
    if ticket is not None:
        watch_response(response, *stats_reader(ticket, counter.add))


class AgentSpecTransport(httpx.BaseTransport):
    """A sync httpx transport that adds the current tags to completion requests."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx.HTTPTransport()
        self._counter = _Counter()

    @property
    def stats(self) -> InjectionStats:
        """A snapshot of the counters."""
        return self._counter.snapshot()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request, ticket = _rewrite(request, self._counter)
        try:
            response = self._inner.handle_request(request)
        except httpx.ConnectError as exc:
            raise _unreachable(request, exc) from exc
        _watch(response, ticket, self._counter)
        return response

    def close(self) -> None:
        self._inner.close()


class AgentSpecAsyncTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`AgentSpecTransport`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._counter = _Counter()

    @property
    def stats(self) -> InjectionStats:
        """A snapshot of the counters."""
        return self._counter.snapshot()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request, ticket = _rewrite(request, self._counter)
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.ConnectError as exc:
            raise _unreachable(request, exc) from exc
        _watch(response, ticket, self._counter)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _wrap_transports(client: httpx.Client | httpx.AsyncClient) -> None:
    """Wrap every transport ``client`` may send through -- its own and each mounted one
    (``proxy=``, environment proxies, ``mounts=``) -- in the tagging transport, in place;
    one set of counters for all. A transport that already tags is kept as it is."""
    if not isinstance(client, httpx.Client | httpx.AsyncClient):
        raise TypeError(f"not an httpx.Client or httpx.AsyncClient: {type(client).__name__}")
    tagging: type[AgentSpecTransport] | type[AgentSpecAsyncTransport] = (
        AgentSpecTransport if isinstance(client, httpx.Client) else AgentSpecAsyncTransport
    )
    main = client._transport
    if not isinstance(main, tagging):
        main = tagging(main)  # type: ignore[arg-type]
        client._transport = main  # type: ignore[assignment]
    counter = main._counter

    def wrap(transport: Any) -> Any:
        if transport is None or isinstance(transport, tagging):
            return transport  # None: the client's own transport (a NO_PROXY entry)
        wrapped = tagging(transport)
        wrapped._counter = counter
        return wrapped

    client._mounts = {pattern: wrap(t) for pattern, t in client._mounts.items()}


def agentspec_http_clients(
    *,
    transport: httpx.BaseTransport | None = None,
    async_transport: httpx.AsyncBaseTransport | None = None,
    **client_kwargs: Any,
) -> tuple[httpx.Client, httpx.AsyncClient]:
    """A sync and an async httpx client whose transports add the tags.

    ``client_kwargs`` go to both ``httpx.Client`` and ``httpx.AsyncClient`` and mean what
    they mean there: ``limits``, ``verify``, ``cert``, ``http1``/``http2``, ``timeout``,
    ``headers``, ``proxy``, ``mounts``, ``trust_env`` (environment proxies such as
    ``HTTPS_PROXY``/``NO_PROXY``)... Every transport the clients send through -- the
    default one, a proxy's (``proxy=`` or from the environment) and each of ``mounts`` --
    adds the tags, with one set of :class:`InjectionStats` counters per client.
    ``transport``/``async_transport`` replace the default transport, as ``transport=``
    does in httpx (then ``limits``, ``verify``, ``cert``, ``http1``/``http2`` do not
    apply to it and environment proxies are not used).
    """
    sync_client = httpx.Client(transport=transport, **client_kwargs)
    async_client = httpx.AsyncClient(transport=async_transport, **client_kwargs)
    _wrap_transports(sync_client)
    _wrap_transports(async_client)
    return sync_client, async_client


def agentspec_chat_openai(
    *,
    transport: httpx.BaseTransport | None = None,
    async_transport: httpx.AsyncBaseTransport | None = None,
    **chat_openai_kwargs: Any,
) -> Any:
    """``ChatOpenAI(**chat_openai_kwargs)`` whose requests carry the current tags.

    Its clients are built as by :func:`agentspec_http_clients` (``transport``/
    ``async_transport`` as there). An ``http_client``/``http_async_client`` given instead
    is used as it is (its headers, event hooks, proxies, limits...), with its transports
    wrapped in place to add the tags, as :func:`agentspec_http_clients` wraps its own.

    Raises:
        MissingDependencyError: ``langchain-openai`` is not installed.
        TypeError: ``transport`` is given with ``http_client`` (or ``async_transport``
            with ``http_async_client``), or a given client is not an httpx client.
    """
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        raise MissingDependencyError(
            "langchain-openai",
            "tags on a remote vLLM server",
            "pip install 'agentspec-mw-langgraph[openai]'",
        ) from None
    clients: list[Any] = []
    choices: tuple[tuple[str, type[Any], Any, str], ...] = (
        ("http_client", httpx.Client, transport, "transport"),
        ("http_async_client", httpx.AsyncClient, async_transport, "async_transport"),
    )
    for key, cls, own, own_key in choices:
        client = chat_openai_kwargs.pop(key, None)
        if client is not None and own is not None:
            raise TypeError(
                f"pass {key}= or {own_key}=, not both: a given client keeps its own "
                "transport (agentspec_chat_openai wraps it to add the tags)"
            )
        if client is not None and not isinstance(client, cls):
            raise TypeError(f"{key}= must be an {cls.__qualname__}, got {type(client).__name__}")
        client = client if client is not None else cls(transport=own)
        _wrap_transports(client)
        clients.append(client)
    return ChatOpenAI(http_client=clients[0], http_async_client=clients[1], **chat_openai_kwargs)
