"""Review 70 of the server integration: ``python -m agentspec_mw_vllm.serve --dry-run``,
the reserved scope ``"default"``, the Cohere API on bound servers, the ``--api-key``
guard, proposer options with vLLM's methods, and the 403 message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from agentspec_mw.cli import build_parser
from agentspec_mw_vllm import serve as serve_module
from agentspec_mw_vllm.cli import serve_config_from_args
from agentspec_mw_vllm.middleware import RequestGuard
from agentspec_mw_vllm.serve import API_KEY_ENV, server_env
from agentspec_mw_vllm.tenancy import DEFAULT_SCOPE, TenancyConfig, bind_body, load_scope_keys

from .test_tenancy import _Echo


def _cfg(*argv: str):  # type: ignore[no-untyped-def]
    return serve_config_from_args(build_parser().parse_args(["serve", "--model", "m", *argv]))


def _client(config: TenancyConfig) -> tuple[TestClient, _Echo]:
    echo = _Echo()
    return TestClient(RequestGuard(echo, config)), echo


def _post(client: TestClient, body: dict[str, Any], path: str = "/v1/completions", **h: str) -> Any:
    return client.post(
        path, content=json.dumps(body), headers={"Content-Type": "application/json", **h}
    )


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"k1": "tenant-1"}))
    return path


# 1. python -m agentspec_mw_vllm.serve


def test_module_main_dry_run_prints_the_command_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_server(cfg: Any) -> int:
        raise AssertionError("--dry-run started the server")

    monkeypatch.setattr(serve_module, "serve", no_server)
    assert serve_module.main(["--dry-run", "--model", "m", "--speculative", "none"]) == 0
    assert "vllm.entrypoints.openai.api_server" in capsys.readouterr().out


def test_module_main_bad_option_is_one_line_with_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(serve_module, "serve", lambda cfg: 0)
    assert serve_module.main(["--model", "m", "--k", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentspec serve: error: k:") and err.count("\n") == 1


# 2. the reserved scope "default"


def test_default_scope_cannot_be_bound(tmp_path: Path) -> None:
    assert DEFAULT_SCOPE == "default"
    with pytest.raises(ValueError, match="reserved"):
        TenancyConfig(scope_keys={"k1": "tenant-1", "k2": "default"})
    table = tmp_path / "keys.json"
    table.write_text(json.dumps({"k2": "default"}))
    with pytest.raises(ValueError, match="reserved"):
        load_scope_keys(table)
    with pytest.raises(ValueError, match="reserved"):
        _cfg("--scope-keys", str(table))
    with pytest.raises(ValueError, match="reserved"):
        bind_body({"prompt": "x"}, "default")
    client, echo = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    r = _post(client, {"prompt": "x"}, **{"X-Tenant-Id": "default"})
    assert r.status_code == 403 and "reserved" in r.json()["error"]["message"]
    assert echo.bodies == []
    assert _post(client, {"prompt": "x"}, **{"X-Tenant-Id": "Default"}).status_code == 200


# 3. the Cohere API drops vllm_xargs: off on bound servers


@pytest.mark.parametrize("path", ["/cohere/v2/chat", "/cohere/v2/chat/render"])
def test_cohere_api_is_off_on_bound_servers(path: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    client, echo = _client(TenancyConfig(scope_keys={"k1": "tenant-1"}))
    assert _post(client, body, path).status_code == 401  # authentication first
    r = _post(client, body, path, Authorization="Bearer k1")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    assert "vllm_xargs" in r.json()["error"]["message"] and echo.bodies == []
    client, echo = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    assert _post(client, body, path, **{"X-Tenant-Id": "t1"}).status_code == 404
    client, echo = _client(TenancyConfig())  # unbound: one trust domain, passed on
    assert _post(client, body, path).status_code == 200 and echo.bodies == [body]


# 4. the --api-key guard


@pytest.mark.parametrize(
    "extra",
    [
        ["--api-key", "x"],
        ["--api_key", "x"],
        ["--api-key=x"],
        ["--api_key=x"],
        ["--api-k", "x"],
        ["--api-ke=x"],
        ["--api_k", "x"],
    ],
)
def test_api_key_in_any_spelling_vllm_accepts_is_refused_when_bound(
    keys_file: Path, extra: list[str]
) -> None:
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-keys", str(keys_file), "--", *extra)
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-header", "X-Tenant-Id", "--", *extra)
    _cfg("--", *extra)  # unbound: vLLM's own key is fine


def test_other_api_options_pass_the_guard(keys_file: Path) -> None:
    cfg = _cfg("--scope-keys", str(keys_file), "--", "--api-server-count", "1")
    assert cfg.extra_args == ["--api-server-count", "1"]


def test_vllm_api_key_env_is_refused_when_bound(
    keys_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "secret")
    with pytest.raises(ValueError, match=API_KEY_ENV):
        _cfg("--scope-keys", str(keys_file))
    with pytest.raises(ValueError, match=API_KEY_ENV):
        _cfg("--scope-header", "X-Tenant-Id")
    _cfg()  # unbound: vLLM reads it, as it would without us
    monkeypatch.delenv(API_KEY_ENV)
    cfg = _cfg("--scope-keys", str(keys_file))
    with pytest.raises(ValueError, match=API_KEY_ENV):
        server_env({API_KEY_ENV: "secret"}, cfg)
    server_env({API_KEY_ENV: ""}, cfg)  # empty: vLLM sets no key either


# 5. --cost-model / --proposer-options need one of our proposers


@pytest.mark.parametrize("spec", ["ngram", "suffix", "none"])
def test_proposer_settings_are_refused_with_vllms_methods(spec: str) -> None:
    with pytest.raises(ValueError, match="--cost-model"):
        _cfg("--speculative", spec, "--cost-model", "measured")
    with pytest.raises(ValueError, match="--proposer-options"):
        _cfg("--speculative", spec, "--proposer-options", '{"draft_len": 2}')
    _cfg("--speculative", spec)  # the defaults
    _cfg("--speculative", spec, "--proposer-options", "{}")  # nothing to ignore
    assert _cfg("--cost-model", "measured").cost_model == "measured"  # agentspec: used


# 6. the 403 message


def test_foreign_scope_message_names_the_binding_in_use() -> None:
    body = {"prompt": "p", "vllm_xargs": {"agentspec_v": 1, "agentspec_scope": "other"}}
    client, _ = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    r = _post(client, body, **{"X-Tenant-Id": "t1"})
    message = r.json()["error"]["message"]
    assert r.status_code == 403 and "X-Tenant-Id header" in message
    assert "API key" not in message
    client, _ = _client(TenancyConfig(scope_keys={"k1": "t1"}))
    r = _post(client, body, Authorization="Bearer k1")
    assert r.status_code == 403 and "API key" in r.json()["error"]["message"]


def test_own_scope_sent_as_a_number_is_accepted() -> None:
    body = {"prompt": "p", "vllm_xargs": {"agentspec_v": 1, "agentspec_scope": 123}}
    client, echo = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    assert _post(client, body, **{"X-Tenant-Id": "123"}).status_code == 200
    assert echo.bodies[0]["vllm_xargs"]["agentspec_scope"] == "123"
    assert bind_body(body, "123")["vllm_xargs"]["agentspec_scope"] == "123"
