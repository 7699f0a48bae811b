"""The ASGI middleware ``agentspec serve`` installs in vLLM's server (``--middleware``).

vLLM's ``api_server`` imports ``agentspec_mw_vllm.middleware.RequestGuard`` and
adds it as the outermost middleware of its app; it reads its
:class:`~agentspec_mw_vllm.tenancy.TenancyConfig` from the environment once, when the
app is built (a bad key table stops the server from starting). Per request:

1. **Authentication** (only with a scope binding): requests to vLLM's API paths (``/v1``,
   ``/v2``, ``/inference``, ``/cohere``) and every request with a body, on any path
   (``/invocations`` and ``/tokenize`` too), must carry a known key or the trusted header,
   else HTTP 401. ``/health``, ``/metrics`` and other ``GET`` paths stay open.
2. **Body checks** (always, for ``POST``/``PUT``/``PATCH``): the body is buffered up to
   ``max_body_bytes`` (HTTP 413 above). A JSON body with text that cannot be encoded as
   UTF-8 (a lone surrogate, escaped as ``"\\ud800"`` or raw, in ``messages``, ``prompt``,
   ``stop`` or ``vllm_xargs``) gets HTTP 400 naming the field, before vLLM sees it; so
   does JSON nested too deeply to parse. Other bodies pass unchanged, unless scopes are
   bound:
3. **Scope binding**: the body must be a JSON object (HTTP 400; a form or binary body gets
   415), and :func:`~agentspec_mw_vllm.tenancy.bind_body` writes the bound scope into its
   ``vllm_xargs`` (HTTP 403 for a claimed foreign scope; HTTP 400 for a beam search,
   ``use_beam_search``, whose engine requests vLLM builds without ``vllm_xargs``, on any
   path: ``/invocations`` dispatches to the OpenAI endpoints). WebSocket connections are
   closed before they open (code 1008): their messages cannot be bound to a scope. Paths
   where vLLM drops ``vllm_xargs`` (:data:`UNBOUNDABLE_PREFIXES`: the Cohere API, which
   rebuilds each request without them) get HTTP 404 after authentication: their requests
   would run without tags, in the scope that requests without tags share.

Error bodies have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from agentspec_mw_vllm.metrics import get_metrics
from agentspec_mw_vllm.tenancy import Refusal, TenancyConfig, bind_body, find_unencodable

__all__ = ["RequestGuard", "API_PREFIXES", "UNBOUNDABLE_PREFIXES"]

API_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
"""Paths vLLM's own ``--api-key`` guards; with a binding these need a key for any method."""
UNBOUNDABLE_PREFIXES = ("/cohere",)
"""Paths whose requests vLLM rebuilds without ``vllm_xargs``; off (HTTP 404) with a binding."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_OPEN_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Scope = dict[str, Any]
Message = dict[str, Any]


class RequestGuard:
    """Pure ASGI middleware: authentication, body checks, scope binding (module doc)."""

    def __init__(self, app: Any, config: TenancyConfig | None = None) -> None:
        self.app = app
        self.config = config if config is not None else TenancyConfig.from_env()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and self.config.bound:
            await _refuse_websocket(receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self._handle(scope, receive, send)
        except Refusal as refusal:
            await _answer(send, refusal)
        except _Disconnected:
            return

    async def _handle(self, scope: Scope, receive: Any, send: Any) -> None:
        method = scope.get("method", "GET")
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        headers = _headers(scope)
        bound = None
        if self.config.bound and method != "OPTIONS":
            if path.startswith(API_PREFIXES) or method not in _OPEN_METHODS:
                bound = self.config.scope_of(headers)
            if path.startswith(UNBOUNDABLE_PREFIXES):
                raise Refusal(
                    404,
                    "this path is off on this server: it binds tenants' scopes, and vLLM "
                    "drops the scope (vllm_xargs) of requests to it; use the OpenAI API (/v1)",
                )
        if method not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        body = await self._read_body(headers, receive)
        new_body = self._check_body(body, headers.get("content-type", ""), bound)
        if new_body is not None:
            body = new_body
            scope = {**scope, "headers": _with_length(scope["headers"], len(body))}
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, headers: dict[str, str], receive: Any) -> bytes:
        limit = self.config.max_body_bytes
        too_big = Refusal(413, f"request body over {limit} bytes (this server's limit)")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _check_body(self, body: bytes, content_type: str, bound: str | None) -> bytes | None:
        """Refuse what must not reach vLLM; return a rewritten body, or ``None`` to keep it."""
        json_type = _is_json_type(content_type)
        if not body:
            if bound is not None and json_type:
                raise Refusal(400, "empty request body: send a JSON object")
            return None
        try:  # parsed as vLLM parses it (Starlette: json.loads of the bytes, which detects
            # UTF-8/16/32 and lets encoded surrogates through)
            obj = json.loads(body)
        except RecursionError:
            raise Refusal(400, "request body nests JSON too deeply") from None
        except ValueError:  # not JSON, or not text: vLLM answers it (unless bound, below)
            obj = _NOT_JSON
        if obj is not _NOT_JSON:
            where = find_unencodable(obj)
            if where is not None:
                raise Refusal(
                    400,
                    f"request field {where} holds text that cannot be encoded as UTF-8 "
                    "(a lone surrogate such as \\ud800); send valid Unicode text",
                    param=where,
                )
        if bound is None:
            return None
        if obj is _NOT_JSON:
            if json_type:
                raise Refusal(400, "request body is not valid JSON")
            raise Refusal(
                415, "this server binds tenants' scopes and accepts JSON request bodies only"
            )
        if not isinstance(obj, dict):
            raise Refusal(400, "request body must be a JSON object")
        bound_obj = bind_body(obj, bound, get_metrics(), self.config.bound_by)
        return json.dumps(bound_obj, ensure_ascii=False).encode("utf-8")


class _Disconnected(Exception):
    """The client went away while sending its body."""


_NOT_JSON = object()


async def _refuse_websocket(receive: Any, send: Any) -> None:
    """Close a WebSocket before it opens: its messages cannot be bound to a scope."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send(
            {
                "type": "websocket.close",
                "code": 1008,
                "reason": "this server binds tenants' scopes: WebSocket endpoints are off",
            }
        )


def _headers(scope: Scope) -> dict[str, str]:
    """Request headers, lower-case names, latin-1 decoded (as HTTP sends them)."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        out[name.decode("latin-1").lower()] = value.decode("latin-1")
    return out


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [
        (k, v) for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding")
    ]
    return [*kept, (b"content-length", str(length).encode())]


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that yields ``body`` once, then defers to the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message: Message = await receive()
        return message

    return replay


async def _answer(send: Any, refusal: Refusal) -> None:
    payload = json.dumps(refusal.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
