"""Scope binding for a shared server: who a request is, and which isolation scope it gets.

Without configuration (a single tenant) a request's scope is what its client sends in
``vllm_xargs.agentspec_scope`` (``"default"`` when it sends none or no tags): every client
of the server can read drafting state of every scope through timing, so one server is one
trust domain. A :class:`TenancyConfig` binds scopes on the server side instead, by one of

* a **key table** ``{api_key: scope}`` (``agentspec serve --scope-keys FILE``): the
  request's ``Authorization: Bearer <key>`` must be in the table (else HTTP 401), and the
  key's scope is the request's scope;
* a **trusted header** (``agentspec serve --scope-header X-Tenant-Id``): a proxy in front
  of the server authenticates clients and sets the header; its value is the scope (a
  request without it gets HTTP 401). Only for servers that clients cannot reach directly.

Neither may bind the reserved scope :data:`DEFAULT_SCOPE` (``"default"``), which requests
without tags share: a key table listing it is refused, a header naming it gets HTTP 403.

With a binding, :func:`bind_body` writes the scope into the request body's
``vllm_xargs``, and into ``sampling_params.extra_args`` where a body carries vLLM's own
sampling parameters (``/inference/v1/generate``): scope-only tags
(``{"agentspec_v": 1, "agentspec_scope": scope}``) for a request without tags, so
tag-free requests of different tenants are isolated too; the bound scope for tagged
requests; a body whose ``agentspec_scope`` names another scope is refused (HTTP 403);
tags that do not decode are replaced by scope-only tags (the request runs tag-free inside
its own scope, never in a shared one). A body asking for beam search (``use_beam_search``
read as true, as vLLM reads it, or a value vLLM cannot read) is refused (HTTP 400): vLLM's
beam search cannot carry ``vllm_xargs`` (``BeamSearchParams`` has no ``extra_args``, and
``BeamSearchOnlineMixin.beam_search`` sends the engine a fresh ``SamplingParams`` per beam
step), so every tenant's beam searches would run tag-free in the shared scope
:data:`DEFAULT_SCOPE`. :func:`find_unencodable` finds text that cannot be
encoded as UTF-8 (lone surrogates), which vLLM answers with an empty HTTP 500.
:mod:`agentspec_mw_vllm.middleware` applies all of this in the server.

``agentspec serve`` hands the configuration to the server process in environment
variables (:data:`SCOPE_KEYS_ENV`, :data:`SCOPE_HEADER_ENV`, :data:`MAX_BODY_ENV`), read
once when the server builds its app.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from agentspec_mw.tags import MAX_ID_CHARS, WIRE_PREFIX, WIRE_VERSION, StructureTags
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.session import decode_tags

__all__ = [
    "DEFAULT_SCOPE",
    "MAX_BODY_ENV",
    "SCOPE_HEADER_ENV",
    "SCOPE_KEYS_ENV",
    "Refusal",
    "TenancyConfig",
    "bind_body",
    "find_unencodable",
    "load_scope_keys",
]

SCOPE_KEYS_ENV = "AGENTSPEC_SCOPE_KEYS"
"""Path of the JSON key table ``{api_key: scope}``."""
SCOPE_HEADER_ENV = "AGENTSPEC_SCOPE_HEADER"
"""Name of the trusted header that carries the scope."""
MAX_BODY_ENV = "AGENTSPEC_MAX_BODY_BYTES"
"""Largest request body the middleware buffers (bytes)."""
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_SCOPE: str = StructureTags.model_fields["scope"].default
"""The scope of requests without tags (``"default"``), reserved: never a bound scope, since
a tenant bound to it would draft from every request that reaches the engine tag-free."""
_SCOPE_RE = re.compile(rf"[\x21-\x7e]{{1,{MAX_ID_CHARS}}}")
_HEADER_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
_SCOPE_KEY = f"{WIRE_PREFIX}scope"
_BEAM_KEY = "use_beam_search"
"""vLLM's OpenAI request field that runs beam search (which drops ``vllm_xargs``)."""
_BOOL: TypeAdapter[bool] = TypeAdapter(bool)


class Refusal(Exception):
    """A request the server answers itself, with an OpenAI-style error body."""

    TYPES = {
        400: "BadRequestError",
        401: "AuthenticationError",
        403: "PermissionDeniedError",
        404: "NotFoundError",
        413: "RequestTooLargeError",
        415: "UnsupportedMediaTypeError",
    }

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, as vLLM and OpenAI answer."""
        kind = self.TYPES.get(self.status, "Error")
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.status,
            }
        }


def _check_scope(scope: str, what: str) -> str:
    if not _SCOPE_RE.fullmatch(scope):
        raise ValueError(
            f"{what}: scope {scope[:40]!r} must be 1..{MAX_ID_CHARS} printable ASCII "
            "characters without spaces"
        )
    if scope == DEFAULT_SCOPE:
        raise ValueError(
            f"{what}: scope {DEFAULT_SCOPE!r} is reserved for requests without tags (a "
            "tenant bound to it would draft from all of them); choose another name"
        )
    return scope


class TenancyConfig(BaseModel):
    """How the server binds requests to scopes (at most one of the two ways)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scope_keys: dict[str, str] | None = None
    """API key → scope; requests must send ``Authorization: Bearer <key>``."""
    scope_header: str | None = None
    """Header a trusted proxy sets to the scope (e.g. ``X-Tenant-Id``)."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    """Largest request body accepted (HTTP 413 above); the middleware buffers bodies."""

    @field_validator("scope_keys")
    @classmethod
    def _keys(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("scope_keys is empty: give at least one {api_key: scope}")
        for key, scope in v.items():
            # ASCII: an HTTP header carries bytes, which the server reads as latin-1, so a
            # key of other characters could never match the one a client sends
            printable = key.isascii() and key.isprintable()
            if not key or not printable or any(c.isspace() for c in key):
                raise ValueError(
                    "scope_keys: API keys must be non-empty printable ASCII without spaces"
                )
            _check_scope(scope, "scope_keys")
        return v

    @field_validator("scope_header")
    @classmethod
    def _header(cls, v: str | None) -> str | None:
        if v is not None and not _HEADER_RE.fullmatch(v):
            raise ValueError(f"scope_header={v!r:.80} must be a header name (letters, digits, -)")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> TenancyConfig:
        if self.scope_keys is not None and self.scope_header is not None:
            raise ValueError("bind scopes by scope_keys or by scope_header, not both")
        return self

    _digests: dict[bytes, str] = PrivateAttr(default_factory=dict)
    """SHA-256 of each key → scope: keys are looked up by digest, not compared as text."""

    def model_post_init(self, context: Any) -> None:
        """Index the key table by digest."""
        for key, scope in (self.scope_keys or {}).items():
            self._digests[hashlib.sha256(key.encode("utf-8")).digest()] = scope

    @property
    def bound(self) -> bool:
        """True when scopes are bound by the server (a key table or a trusted header)."""
        return self.scope_keys is not None or self.scope_header is not None

    @property
    def bound_by(self) -> str:
        """What binds a request's scope, for error messages: ``"API key"`` or ``"<header>
        header"``."""
        return "API key" if self.scope_header is None else f"{self.scope_header} header"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TenancyConfig:
        """Read :data:`SCOPE_KEYS_ENV`, :data:`SCOPE_HEADER_ENV` and :data:`MAX_BODY_ENV`."""
        env = os.environ if environ is None else environ
        fields: dict[str, Any] = {}
        if env.get(SCOPE_KEYS_ENV):
            fields["scope_keys"] = load_scope_keys(env[SCOPE_KEYS_ENV])
        if env.get(SCOPE_HEADER_ENV):
            fields["scope_header"] = env[SCOPE_HEADER_ENV]
        if env.get(MAX_BODY_ENV):
            try:
                fields["max_body_bytes"] = int(env[MAX_BODY_ENV])
            except ValueError:
                raise ValueError(
                    f"{MAX_BODY_ENV}={env[MAX_BODY_ENV]!r} is not a number of bytes"
                ) from None
        return cls(**fields)

    def scope_of(self, headers: Mapping[str, str]) -> str | None:
        """The bound scope of a request (``headers`` with lower-case names); ``None`` when
        nothing is bound.

        Raises:
            Refusal: 401 for a missing or unknown key, or a missing or malformed header;
                403 for a header naming the reserved scope :data:`DEFAULT_SCOPE`.
        """
        if self.scope_keys is not None:
            scheme, _, key = headers.get("authorization", "").partition(" ")
            digest = hashlib.sha256(key.strip().encode("utf-8", "replace")).digest()
            scope = self._digests.get(digest) if scheme.lower() == "bearer" else None
            if scope is None:
                raise Refusal(
                    401,
                    "missing or unknown API key: send 'Authorization: Bearer <key>' with a "
                    "key this server's --scope-keys table lists",
                )
            return scope
        if self.scope_header is not None:
            value = headers.get(self.scope_header.lower())
            if value is None or not _SCOPE_RE.fullmatch(value):
                raise Refusal(
                    401,
                    f"missing or malformed {self.scope_header} header: the proxy in front of "
                    f"this server must set it to the tenant's scope (1..{MAX_ID_CHARS} "
                    "printable ASCII characters)",
                )
            if value == DEFAULT_SCOPE:
                raise Refusal(
                    403,
                    f"the {self.scope_header} header names the reserved scope "
                    f"{DEFAULT_SCOPE!r} (the scope of requests without tags): the proxy in "
                    "front of this server must set it to the tenant's own scope",
                )
            return value
        return None


def load_scope_keys(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a key table: a JSON object ``{api_key: scope}`` (raises ``ValueError``)."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read the scope key table {str(path)!r}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"scope key table {str(path)!r} is not JSON: {exc}") from None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise ValueError(
            f'scope key table {str(path)!r} must be a JSON object {{"api-key": "scope", ...}}'
        )
    TenancyConfig(scope_keys=table)  # validates keys and scopes
    return table


def find_unencodable(obj: Any, path: str = "$") -> str | None:
    """The JSON path of the first string (key or value) of ``obj`` that cannot be encoded
    as UTF-8 (e.g. a lone surrogate from a ``"\\ud800"`` escape); ``None`` if all can."""
    stack: list[tuple[Any, str]] = [(obj, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return where
        elif isinstance(item, dict):
            for key, value in item.items():
                if isinstance(key, str) and not _encodable(key):
                    return f"{where} (a key)"
                stack.append((value, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((value, f"{where}[{i}]") for i, value in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bind_body(
    body: dict[str, Any],
    scope: str,
    metrics: DrafterMetrics | None = None,
    bound_by: str = "API key",
) -> dict[str, Any]:
    """``body`` with its tags bound to ``scope`` (see the module docstring): in
    ``vllm_xargs`` (the OpenAI endpoints) and, when the body carries ``sampling_params``
    (vLLM's token-in/token-out ``/inference/v1/generate``), in its ``extra_args`` too,
    which that endpoint hands to the engine as they are. Tags that do not decode are
    counted in ``metrics.tag_rejections`` (and logged) like the engine does. ``bound_by``
    names what bound the scope in the 403 message (:attr:`TenancyConfig.bound_by`).

    Raises:
        Refusal: 403 when the body's ``agentspec_scope`` names another scope (compared as
            the engine reads it: ``123`` is scope ``"123"``); 400 when ``vllm_xargs``,
            ``sampling_params`` or its ``extra_args`` is not an object, or when the body
            asks for beam search (:func:`_asks_beam_search`).
        ValueError: ``scope`` cannot be bound (malformed, or the reserved
            :data:`DEFAULT_SCOPE`).
    """
    _check_scope(scope, "bind_body")
    if _asks_beam_search(body):
        raise Refusal(
            400,
            "beam search (use_beam_search) is off on this server: it binds tenants' scopes, "
            "and vLLM's beam search drops the scope (vllm_xargs) of the requests it sends "
            "to the engine; leave use_beam_search out",
            param=_BEAM_KEY,
        )
    metrics = metrics or DrafterMetrics(prometheus=False)
    args = _bound_args(body.get("vllm_xargs"), scope, metrics, "vllm_xargs", bound_by)
    out = {**body, "vllm_xargs": args}
    if "sampling_params" in body:
        params = body["sampling_params"]
        if not isinstance(params, dict):
            raise Refusal(400, "sampling_params must be a JSON object", param="sampling_params")
        where = "sampling_params.extra_args"
        out["sampling_params"] = {
            **params,
            "extra_args": _bound_args(params.get("extra_args"), scope, metrics, where, bound_by),
        }
    return out


def _asks_beam_search(body: Mapping[str, Any]) -> bool:
    """Whether vLLM would run ``body`` as a beam search: its ``use_beam_search`` read as
    vLLM's request models read it (pydantic's lax ``bool``: ``true``, ``1``, ``"yes"``,
    ``"on"``, ...). A value that is no bool to pydantic (``null``, ``"maybe"``) counts too:
    vLLM refuses such a request itself, and a guard fails closed.

    vLLM cannot bind a beam search to a scope: ``to_beam_search_params`` leaves
    ``vllm_xargs`` behind (``BeamSearchParams`` has no ``extra_args``), and
    ``BeamSearchOnlineMixin.beam_search`` sends the engine one request per beam and step,
    each with a ``SamplingParams`` of its own (no ``extra_args``). Each would reach the
    proposer tag-free, in :data:`DEFAULT_SCOPE`, which all tenants' beam searches would
    share (their drafts are never verified, each such request generating one token, but
    their prompts would meet in one scope's drafting state)."""
    if _BEAM_KEY not in body:
        return False
    try:
        return _BOOL.validate_python(body[_BEAM_KEY])
    except ValidationError:
        return True


def _bound_args(
    args: Any, scope: str, metrics: DrafterMetrics, where: str, bound_by: str
) -> dict[str, Any]:
    """One ``extra_args`` object (``where`` names it in the body) bound to ``scope``."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise Refusal(400, f"{where} must be a JSON object", param=where)
    claimed = args.get(_SCOPE_KEY)
    if claimed is not None and str(claimed) != scope:  # str: as the engine decodes it
        raise Refusal(
            403,
            f"{where}.{_SCOPE_KEY} names a scope other than the one this request's "
            f"{bound_by} binds it to; leave it out (the server sets it) or send that scope",
            param=f"{where}.{_SCOPE_KEY}",
        )
    ours = {k: v for k, v in args.items() if str(k).startswith(WIRE_PREFIX)}
    rest = {k: v for k, v in args.items() if not str(k).startswith(WIRE_PREFIX)}
    tags: dict[str, Any] = {f"{WIRE_PREFIX}v": WIRE_VERSION, **ours, _SCOPE_KEY: scope}
    if decode_tags(tags, metrics, "(scope binding)") is None:
        # served tag-free, but inside its own scope
        tags = {f"{WIRE_PREFIX}v": WIRE_VERSION, _SCOPE_KEY: scope}
    return {**rest, **tags}
