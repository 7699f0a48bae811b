"""The server middleware without a server: body checks, key/header scope binding, limits.

A fake ASGI app stands in for vLLM and records the body it would have parsed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentspec_mw.tags import tags_from_wire
from agentspec_mw_vllm.metrics import DrafterMetrics
from agentspec_mw_vllm.middleware import RequestGuard
from agentspec_mw_vllm.tenancy import (
    SCOPE_HEADER_ENV,
    SCOPE_KEYS_ENV,
    TenancyConfig,
    bind_body,
    find_unencodable,
    load_scope_keys,
)

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}


class _Echo:
    """Stands in for vLLM: answers 200 with the body it received (parsed as JSON)."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            self.bodies.append(json.loads(body) if body else None)
        except ValueError:
            self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _client(config: TenancyConfig) -> tuple[TestClient, _Echo]:
    echo = _Echo()
    return TestClient(RequestGuard(echo, config)), echo


def _post(
    client: TestClient,
    raw: bytes | str,
    key: str | None = None,
    path: str = "/v1/completions",
    **headers: str,
) -> Any:  # noqa: E501
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw.encode() if isinstance(raw, str) else raw
    return client.post(path, content=data, headers={"Content-Type": "application/json", **headers})


@pytest.mark.parametrize(
    "raw,param",
    [
        ('{"prompt": "hi \\ud800"}', "$.prompt"),
        ('{"messages": [{"role": "user", "content": "\\udfff"}]}', "$.messages[0].content"),
        ('{"prompt": "x", "stop": ["\\ud83d"]}', "$.stop[0]"),
        (
            '{"prompt": "x", "vllm_xargs": {"agentspec_agent": "\\ud800"}}',
            "$.vllm_xargs.agentspec_agent",
        ),  # noqa: E501
        ('{"prompt": "x", "vllm_xargs": {"\\ud800": 1}}', "$.vllm_xargs (a key)"),
    ],
)
def test_lone_surrogates_get_400_before_vllm(raw: str, param: str) -> None:
    client, echo = _client(TenancyConfig())
    resp = _post(client, raw)
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == param and err["code"] == 400 and "UTF-8" in err["message"]
    assert echo.bodies == []


def test_single_tenant_passes_bodies_unchanged() -> None:
    client, echo = _client(TenancyConfig())
    raw = '{"prompt": "\\u00fc \\ud83d\\ude00", "vllm_xargs": {"agentspec_v": 1, "agentspec_scope": "x"}}'  # noqa: E501
    assert _post(client, raw).status_code == 200
    assert echo.bodies[-1]["vllm_xargs"]["agentspec_scope"] == "x"  # the client's claim holds
    assert _post(client, "not json").status_code == 200  # vLLM answers that itself
    assert _post(client, b'{"prompt": "\xed\xa0\x80"}').status_code == 400  # raw surrogate
    assert _post(client, b"\xff\x00\x00").status_code == 200  # not text: vLLM answers it
    assert client.get("/metrics").status_code == 200


def test_body_size_is_bounded() -> None:
    client, echo = _client(TenancyConfig(max_body_bytes=1024))
    resp = _post(client, json.dumps({"prompt": "x" * 2000}))
    assert resp.status_code == 413 and "1024" in resp.json()["error"]["message"]
    assert _post(client, json.dumps({"prompt": "x" * 500})).status_code == 200
    assert _post(client, "[" * 400 + "]" * 400).status_code == 200  # deep but valid
    deep, _ = _client(TenancyConfig(max_body_bytes=1 << 20))
    assert _post(deep, "[" * 200_000).status_code == 400  # RecursionError in json: a 400


def test_key_table_authenticates_and_binds_scopes() -> None:
    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    body = json.dumps({"prompt": "x"})
    for key in (None, "nope", "key-a "[:-2]):
        resp = _post(client, body, key=key)
        assert resp.status_code == 401, key
        assert resp.json()["error"]["type"] == "AuthenticationError"
    assert _post(client, body, path="/invocations").status_code == 401  # any body, any path
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert client.get("/v1/models").status_code == 401
    assert echo.bodies == [None, None]

    # untagged -> scope-only tags; tagged -> its scope; both keys separated
    assert _post(client, body, key="key-a").status_code == 200
    assert echo.bodies[-1]["vllm_xargs"] == {"agentspec_v": 1, "agentspec_scope": "tenant-a"}
    tagged = {
        "prompt": "x",
        "vllm_xargs": {
            "agentspec_v": 1,
            "agentspec_agent": "a",
            "agentspec_query": "q",
            "other": 3,
        },
    }  # noqa: E501
    assert _post(client, json.dumps(tagged), key="key-b").status_code == 200
    sent = echo.bodies[-1]["vllm_xargs"]
    assert sent["other"] == 3 and tags_from_wire(sent).scope == "tenant-b"  # type: ignore[union-attr]

    # claiming another scope: 403; claiming its own: fine
    claim = {"prompt": "x", "vllm_xargs": {"agentspec_v": 1, "agentspec_scope": "tenant-a"}}
    resp = _post(client, json.dumps(claim), key="key-b")
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "PermissionDeniedError"
    assert _post(client, json.dumps(claim), key="key-a").status_code == 200


def test_bound_requests_with_bad_tags_run_scope_only_in_their_scope() -> None:
    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    for bad in (
        {"agentspec_v": 42, "agentspec_agent": "a", "agentspec_query": "q"},
        {"agentspec_v": 1, "agentspec_blocks": "[" * 5000},
        {"agentspec_v": 1, "agentspec_blocks": "[]", "keep": "me"},
    ):
        body = json.dumps({"prompt": "x", "vllm_xargs": bad})
        assert _post(client, body, key="key-a").status_code == 200
        sent = echo.bodies[-1]["vllm_xargs"]
        assert {k: v for k, v in sent.items() if k.startswith("agentspec_")} == {
            "agentspec_v": 1,
            "agentspec_scope": "tenant-a",
        }
        assert sent.get("keep", "me") == "me"


@pytest.mark.parametrize(
    "raw,status",
    [("not json", 400), ("[1, 2]", 400), ('{"vllm_xargs": "x"}', 400), ("", 400)],
)
def test_bound_bodies_must_be_json_objects(raw: str, status: int) -> None:
    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    assert _post(client, raw, key="key-a").status_code == status
    assert echo.bodies == []


def test_bound_form_bodies_are_refused() -> None:
    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    resp = client.post(
        "/v1/audio/transcriptions",
        files={"file": ("a.wav", b"\x00\x01")},
        data={"vllm_xargs": '{"agentspec_scope": "tenant-b"}'},
        headers={"Authorization": "Bearer key-a"},
    )
    assert resp.status_code == 415 and echo.bodies == []


def test_bound_servers_refuse_websockets_and_say_how_to_authenticate() -> None:
    from starlette.websockets import WebSocketDisconnect

    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    with pytest.raises(WebSocketDisconnect) as closed:
        with client.websocket_connect("/v1/realtime", headers={"Authorization": "Bearer key-a"}):
            pass
    assert closed.value.code == 1008
    resp = _post(client, "{}")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"


def test_trusted_header_binds_scopes() -> None:
    client, echo = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    body = json.dumps({"prompt": "x"})
    assert _post(client, body).status_code == 401
    assert _post(client, body, **{"X-Tenant-Id": "has space"}).status_code == 401
    assert _post(client, body, **{"X-Tenant-Id": "t9"}).status_code == 200
    assert echo.bodies[-1]["vllm_xargs"]["agentspec_scope"] == "t9"


def test_config_from_env_and_key_table_checks(tmp_path: Path) -> None:
    table = tmp_path / "keys.json"
    table.write_text(json.dumps(KEYS))
    cfg = TenancyConfig.from_env({SCOPE_KEYS_ENV: str(table)})
    assert cfg.bound and cfg.scope_keys == KEYS
    assert TenancyConfig.from_env({SCOPE_HEADER_ENV: "X-T"}).scope_header == "X-T"
    assert not TenancyConfig.from_env({}).bound
    for bad, match in [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ("{}", "empty"),
        ('{"k": "sp ace"}', "printable ASCII"),
        ('{"": "s"}', "non-empty"),
        ('{"kéy": "s"}', "printable ASCII"),  # a header could never carry it as written
    ]:
        table.write_text(bad)
        with pytest.raises(ValueError, match=match):
            load_scope_keys(table)
    with pytest.raises(ValueError, match="cannot read"):
        load_scope_keys(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="not both"):
        TenancyConfig(scope_keys=KEYS, scope_header="X-T")


def test_find_unencodable_and_bind_body_directly() -> None:
    assert find_unencodable({"a": ["ok", {"b": "ü😀"}]}) is None
    assert find_unencodable({"a": [1, {"b": "\udc80"}]}) == "$.a[1].b"
    metrics = DrafterMetrics(prometheus=False)
    out = bind_body({"vllm_xargs": {"agentspec_v": 2}}, "s", metrics)
    assert out["vllm_xargs"] == {"agentspec_v": 1, "agentspec_scope": "s"}
    assert metrics.snapshot().tag_rejections == {"version": 1}


def test_the_generate_endpoints_sampling_params_are_bound_too() -> None:
    """vLLM's token-in/token-out ``/inference/v1/generate`` (``--tokens-only``,
    ``--enable-scale-out``) takes ``SamplingParams`` as they are: their ``extra_args`` are
    bound like ``vllm_xargs``, so a key cannot claim another tenant's scope there."""
    client, echo = _client(TenancyConfig(scope_keys=KEYS))
    path = "/inference/v1/generate"
    theirs = {"agentspec_v": 1, "agentspec_scope": "tenant-b"}
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 4, "extra_args": theirs}}
    resp = _post(client, json.dumps(body), key="key-a", path=path)
    assert resp.status_code == 403 and "sampling_params.extra_args" in resp.text
    body["sampling_params"] = {"max_tokens": 4}  # untagged: scope-only tags, its own scope
    assert _post(client, json.dumps(body), key="key-a", path=path).status_code == 200
    params = echo.bodies[-1]["sampling_params"]
    assert params["max_tokens"] == 4
    assert params["extra_args"] == {"agentspec_v": 1, "agentspec_scope": "tenant-a"}
    body["sampling_params"] = [1]
    assert _post(client, json.dumps(body), key="key-a", path=path).status_code == 400
