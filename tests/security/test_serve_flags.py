"""``agentspec serve``'s tenancy flags: the middleware is always on, bindings reach the
server process through its environment, bad tables fail before a server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentspec_mw.cli import build_parser
from agentspec_mw_vllm.cli import serve_config_from_args
from agentspec_mw_vllm.metrics import LABELS_ENV
from agentspec_mw_vllm.serve import MIDDLEWARE_PATH, server_command, server_env
from agentspec_mw_vllm.tenancy import MAX_BODY_ENV, SCOPE_HEADER_ENV, SCOPE_KEYS_ENV


def _cfg(*argv: str):  # type: ignore[no-untyped-def]
    return serve_config_from_args(build_parser().parse_args(["serve", "--model", "m", *argv]))


@pytest.mark.parametrize("spec", ["agentspec", "none", "ngram", "suffix"])
def test_middleware_is_installed_for_every_speculative_mode(spec: str) -> None:
    argv = server_command(_cfg("--speculative", spec))
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE_PATH


def test_single_tenant_env_binds_nothing_and_keeps_agent_labels() -> None:
    env = server_env({SCOPE_KEYS_ENV: "/stale", LABELS_ENV: "agent"}, _cfg())
    assert SCOPE_KEYS_ENV not in env and SCOPE_HEADER_ENV not in env
    assert env[LABELS_ENV] == "agent" and int(env[MAX_BODY_ENV]) == 16 << 20


def test_key_table_reaches_the_server_env(tmp_path: Path) -> None:
    table = tmp_path / "keys.json"
    table.write_text(json.dumps({"k1": "tenant-1"}))
    env = server_env({}, _cfg("--scope-keys", str(table), "--max-body-bytes", "4096"))
    assert env[SCOPE_KEYS_ENV] == str(table.resolve())
    assert env[LABELS_ENV] == "none" and env[MAX_BODY_ENV] == "4096"  # agent ids stay private
    env = server_env({}, _cfg("--scope-header", "X-Tenant-Id", "--metrics-labels", "scope"))
    assert env[SCOPE_HEADER_ENV] == "X-Tenant-Id" and env[LABELS_ENV] == "scope"


def test_bad_tenancy_flags_fail_before_a_server_starts(tmp_path: Path) -> None:
    table = tmp_path / "keys.json"
    table.write_text('{"k1": 3}')
    with pytest.raises(ValueError, match="JSON object"):
        _cfg("--scope-keys", str(table))
    table.write_text('{"k1": "t1"}')
    with pytest.raises(ValueError, match="not both"):
        _cfg("--scope-keys", str(table), "--scope-header", "X-T")
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-keys", str(table), "--", "--api-key", "k1")
    with pytest.raises(ValueError, match="unknown"):
        _cfg("--metrics-labels", "agent,tenant")
    with pytest.raises(ValueError, match="header name"):
        _cfg("--scope-header", "X Tenant")
