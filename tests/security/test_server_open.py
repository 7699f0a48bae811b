"""A real single-tenant ``agentspec serve`` under hostile clients.

One server for the module (no scope binding, agent labels on, the agentspec drafter):
fuzzed request bodies get no HTTP 5xx and the server stays up; text that cannot be encoded
as UTF-8 gets a clean 400; hostile block delimiters and agent ids leave ``/metrics``
labels printable and capped; a poisoning request beside a victim leaves the victim's
output unchanged and the victim still drafting.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agentspec_mw_vllm.metrics import MAX_AGENT_LABELS, MAX_BLOCK_LABELS, MAX_LABEL_CHARS
from tests.security.serverutil import REPETITIVE, completion, post, series, total
from tests.security.test_wire_fuzz import _mutated_wire, _random_wire
from tests.serving import http_get

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]
SEED = 32


@pytest.fixture(scope="module")
def server(agentspec_server: str) -> str:
    """The session's shared ``agentspec serve`` (tests/conftest.py)."""
    return agentspec_server


def _fuzz_bodies() -> list[bytes]:
    """A seeded corpus of hostile request bodies (each small; few generate tokens)."""
    rng = random.Random(SEED)
    bodies: list[bytes] = []

    def add(obj: Any) -> None:
        try:
            bodies.append(json.dumps(obj).encode())
        except ValueError:  # e.g. an int too long for str(): not sendable as JSON
            pass

    for i in range(24):
        wire = _random_wire(rng) if i % 2 else _mutated_wire(rng)
        add(completion("Say hi.", 2, {str(k): v for k, v in wire.items()}))
    for field, value in [
        ("prompt", "a\ud800b"),
        ("stop", ["\udfff"]),
        ("max_tokens", -1),
        ("max_tokens", "many"),
        ("temperature", "hot"),
        ("prompt", [[1, 2], "x"]),
        ("prompt", ""),
        ("vllm_xargs", "not a dict"),
        ("vllm_xargs", {"agentspec_v": 1, "agentspec_blocks": [["a", "b"]]}),
        ("vllm_xargs", {"agentspec_v": [1, 2]}),
        ("n", 0),
        ("logprobs", 10**6),
    ]:
        add({**completion("Say hi.", 2), field: value})
    chat = {"model": "SmolLM2-135M-Instruct", "max_tokens": 2, "temperature": 0.0}
    add({**chat, "messages": [{"role": "user", "content": "\ud83d"}]})
    add({**chat, "messages": [{"role": "\udcff", "content": "x"}]})
    add({**chat, "messages": "x"})
    bodies += [
        b"",
        b"{",
        b"[" * 100_000,
        b"\xff\xfe\x00",
        b'{"prompt": "\\ud800", "model": "x"}',
        b'{"prompt": "\xed\xa0\x80", "model": "x", "max_tokens": 2}',  # a raw surrogate
        json.dumps(completion("x", 2)).encode("utf-16"),
        json.dumps(completion("x", 2)).encode()[:-3],
    ]
    return bodies


def test_fuzzed_bodies_give_no_5xx_and_the_server_stays_up(server: str) -> None:
    bodies = _fuzz_bodies()
    paths = ["/v1/completions", "/v1/chat/completions"]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(lambda ib: post(server, ib[1], path=paths[ib[0] % 2])[0], enumerate(bodies))
        )
    assert [s for s in statuses if s >= 500] == [], statuses
    assert 200 in statuses and 400 in statuses
    assert post(server, completion(REPETITIVE, 4))[0] == 200
    http_get(server + "/health")


@pytest.mark.parametrize(
    "body",
    [
        completion("a\ud800", 2),
        {**completion("x", 2), "stop": ["\udfff"]},
        completion("x", 2, {"agentspec_v": 1, "agentspec_scope": "\ud800"}),
        completion("x", 2, {"note\udc80": 1}),
    ],
    ids=["prompt", "stop", "xargs-value", "xargs-key"],
)
def test_lone_surrogates_get_a_clean_400(server: str, body: dict[str, Any]) -> None:
    status, answer = post(server, body)
    assert status == 400
    assert answer["error"]["code"] == 400 and "UTF-8" in answer["error"]["message"]
    status, answer = post(
        server,
        {
            "model": "SmolLM2-135M-Instruct",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "\ud800"}],
        },  # noqa: E501
        path="/v1/chat/completions",
    )
    assert status == 400 and answer["error"]["param"] == "$.messages[0].content"


def test_metric_labels_stay_printable_and_capped(server: str) -> None:
    n = MAX_BLOCK_LABELS + 12
    jobs = []
    for i in range(n):
        start = f"\x1b[{i}m\x00<"  # ESC and NUL bytes: a valid delimiter of 6-7 bytes
        xargs = {
            "agentspec_v": 1,
            "agentspec_agent": f"\x1b]0;agent-{i}\x07" + "ü" * 60,
            "agentspec_query": f"q{i}",
            "agentspec_blocks": json.dumps([[start, "\x00>"]]),
        }
        jobs.append(completion(start + " " + REPETITIVE, 6, xargs))
    with ThreadPoolExecutor(8) as pool:
        assert {post(server, body)[0] for body in pool.map(lambda b: b, jobs)} == {200}
    page = http_get(server + "/metrics")
    assert "\x1b" not in page and "\x00" not in page
    drafted = series(page, "agentspec_drafted_tokens_total")
    agents = {dict(key)["agent"] for key in drafted}
    blocks = {dict(key)["block"] for key in drafted}
    assert len(agents) <= MAX_AGENT_LABELS + 2  # + untagged, other
    hostile_blocks = {b for b in blocks if b.startswith("b0:")}
    assert hostile_blocks, blocks  # the requests drafted inside their own blocks
    assert len(hostile_blocks) <= MAX_BLOCK_LABELS
    for label in agents | blocks:
        assert len(label) <= MAX_LABEL_CHARS and label.isascii() and label.isprintable()


def test_poisoning_requests_leave_a_victims_drafts_alone(server: str) -> None:
    victim = completion(
        REPETITIVE, 24, {"agentspec_v": 1, "agentspec_agent": "victim", "agentspec_query": "v1"}
    )  # noqa: E501
    poison_blocks = ["[]", "[" * 5000, json.dumps([["ü" * 40, "x"]]), '[["\\ud800", "x"]]']
    poisons = [
        completion(
            REPETITIVE,
            24,
            {
                "agentspec_v": 1,
                "agentspec_blocks": blocks,
                "agentspec_agent": "p",
                "agentspec_query": "p",
            },
        )  # noqa: E501
        for blocks in poison_blocks
    ]
    status, alone = post(server, victim)
    assert status == 200
    before = http_get(server + "/metrics")
    with ThreadPoolExecutor(len(poisons) + 1) as pool:
        poison_runs = [pool.submit(post, server, body) for body in poisons]
        status, beside = post(server, victim)
        poison_status = [f.result()[0] for f in poison_runs]
    after = http_get(server + "/metrics")
    assert status == 200 and beside["choices"][0]["text"] == alone["choices"][0]["text"]
    assert poison_status == [200] * len(poisons)
    drafted = lambda page: total(page, "agentspec_drafted_tokens_total", agent="victim")  # noqa: E731
    assert drafted(after) > drafted(before)
    rejected = lambda page: total(page, "agentspec_tag_rejections_total")  # noqa: E731
    assert rejected(after) - rejected(before) == len(poisons)  # the poisons ran tag-free
