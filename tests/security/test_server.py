"""A real multi-tenant ``agentspec serve``: scopes bound by API key.

One server for the module (``--scope-keys`` with two keys, ``--metrics-labels scope``, the
agentspec drafter drafting only from the ``agent`` and ``scope`` histories, which a
request's output joins when it finishes): the same prompt sent with another key drafts
nothing from the first key's output (0 cross-scope drafts) while the first key's repeat
does; unknown keys get 401, a claimed foreign scope 403; untagged requests run in their
key's scope (the per-scope counters grow for that tenant only, never for ``default``);
agent ids stay off ``/metrics``; fuzzed bodies give no 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.security.serverutil import REPETITIVE, completion, post, series, total
from tests.security.test_server_open import _fuzz_bodies
from tests.serving import http_get, running_server
from tests.vllm.conftest import ENGINE_KW

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
SCOPE_DRAFTED = "agentspec_scope_drafted_tokens_total"
#: Draft only from finished requests' outputs of the same scope (no prompt lookup).
HISTORY_ONLY = {"experimental": {"sources": ["agent", "scope"], "index_agent_live": False}}
PROBE = "Write the alphabet in capital letters separated by spaces: A B C D"


def _scopes(server: str) -> dict[str, float]:
    """Verified draft tokens per scope label."""
    page = http_get(server + "/metrics")
    return {dict(k)["scope"]: v for k, v in series(page, SCOPE_DRAFTED).items()}


def test_no_drafts_cross_scopes_bound_by_key(server: str) -> None:
    status, first = post(server, completion(PROBE, 24), key="key-a")
    assert status == 200
    before = _scopes(server)
    status, other = post(server, completion(PROBE, 24), key="key-b")
    assert status == 200 and other["choices"][0]["text"] == first["choices"][0]["text"]
    after_b = _scopes(server)
    assert after_b.get("tenant-b", 0) == before.get("tenant-b", 0) == 0  # nothing to draft from
    status, again = post(server, completion(PROBE, 24), key="key-a")
    assert status == 200 and again["choices"][0]["text"] == first["choices"][0]["text"]
    assert _scopes(server).get("tenant-a", 0) > after_b.get("tenant-a", 0)  # its own history


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("vllm")
    from tests.vllm.test_engine import _agentspec_available

    if not _agentspec_available():
        pytest.skip("the agentspec proposer is not in this checkout")
    tmp = tmp_path_factory.mktemp("server")
    (tmp / "keys.json").write_text(json.dumps(KEYS))
    args = ["--speculative", "agentspec", "--k", str(ENGINE_KW["k"])]
    args += ["--scope-keys", str(tmp / "keys.json"), "--metrics-labels", "scope"]
    args += ["--proposer-options", json.dumps(HISTORY_ONLY)]
    args += ["--max-model-len", str(ENGINE_KW["max_model_len"]), "--"]
    args += ["--enforce-eager", "--kv-cache-memory-bytes", str(ENGINE_KW["kv_cache_memory_bytes"])]
    args += ["--max-num-seqs", str(ENGINE_KW["max_num_seqs"])]
    with running_server(args, tmp / "server.log") as base:
        yield base


def test_unknown_keys_get_401_and_foreign_scopes_403(server: str) -> None:
    body = completion("Say hi.", 2)
    for key in (None, "key-c", "Key-a"):
        status, answer = post(server, body, key=key)
        assert status == 401 and answer["error"]["type"] == "AuthenticationError", key
    assert post(server, body, path="/tokenize")[0] == 401
    http_get(server + "/health")
    http_get(server + "/metrics")
    claim = completion("Say hi.", 2, {"agentspec_v": 1, "agentspec_scope": "tenant-a"})
    status, answer = post(server, claim, key="key-b")
    assert status == 403 and "scope" in answer["error"]["message"]
    assert post(server, claim, key="key-a")[0] == 200


def test_untagged_requests_run_in_their_keys_scope(server: str) -> None:
    before = _scopes(server)
    for _ in range(2):  # the second drafts from the first's output, in tenant-a's scope
        assert post(server, completion(REPETITIVE, 24), key="key-a")[0] == 200
    mid = _scopes(server)
    assert mid.get("tenant-a", 0) > before.get("tenant-a", 0)
    assert mid.get("tenant-b", 0) == before.get("tenant-b", 0)  # b sent nothing
    tagged = {"agentspec_v": 1, "agentspec_agent": "secret-agent", "agentspec_query": "q1"}
    poison = {"agentspec_v": 1, "agentspec_agent": "secret-agent", "agentspec_blocks": "[" * 5000}
    for xargs in (tagged, tagged, poison):
        assert post(server, completion(REPETITIVE, 24, xargs), key="key-b")[0] == 200
    after = _scopes(server)
    assert after.get("tenant-b", 0) > mid.get("tenant-b", 0)
    assert after.get("tenant-a", 0) == mid.get("tenant-a", 0)
    assert "default" not in after  # every request was bound to its key's scope
    page = http_get(server + "/metrics")
    assert "secret-agent" not in page  # agent labels are off with a scope binding
    agents = {dict(k)["agent"] for k in series(page, "agentspec_drafted_tokens_total")}
    assert agents <= {"tagged", "untagged"}, agents
    assert total(page, "agentspec_tag_rejections_total") >= 1  # the poison ran scope-only


def test_fuzzed_bodies_with_and_without_a_key_give_no_5xx(server: str) -> None:
    bodies = _fuzz_bodies()
    with ThreadPoolExecutor(8) as pool:
        keyed = list(pool.map(lambda b: post(server, b, key="key-a")[0], bodies))
        anonymous = list(pool.map(lambda b: post(server, b)[0], bodies[:10]))
    assert [s for s in keyed if s >= 500] == [], keyed
    assert 200 in keyed and 400 in keyed
    assert set(anonymous) == {401}
    http_get(server + "/health")
