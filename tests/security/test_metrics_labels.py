"""Tenant-safe metric labels: cleaned, capped, and identities only when asked."""

from __future__ import annotations

import pytest

from agentspec_mw_vllm.metrics import (
    LABELS_ENV,
    MAX_AGENT_LABELS,
    MAX_BLOCK_LABELS,
    MAX_LABEL_CHARS,
    MAX_SCOPE_LABELS,
    DrafterMetrics,
    parse_labels,
)

HOSTILE = ["\x00\x1b[31m", 'a"b\\c\nd', "ü" * 100, "\ud800", "<tool_call>", "x" * 500]


def _labels(snapshot_keys: list[str]) -> set[str]:
    return {part for key in snapshot_keys for part in key.split("/", 1)}


def test_block_and_agent_labels_are_cleaned_and_capped() -> None:
    m = DrafterMetrics(prometheus=False, labels="agent")
    for i in range(300):
        hostile = HOSTILE[i % len(HOSTILE)] + str(i)
        m.record_verified(m.agent_label(hostile), f"b0:{hostile}", 2, 1)
    m.record_verified(m.agent_label("planner"), "code", 1, 1)  # fixed block names survive
    snap = m.snapshot()
    agents = {key.split("/", 1)[0] for key in snap.drafted}
    blocks = {key.split("/", 1)[1] for key in snap.drafted}
    assert len(agents) <= MAX_AGENT_LABELS + 1 and "other" in agents
    assert len(blocks) <= MAX_BLOCK_LABELS + 2 and "other" in blocks and "code" in blocks
    for label in agents | blocks:
        assert len(label) <= MAX_LABEL_CHARS
        assert all(0x20 <= ord(c) < 0x7F and c not in '"\\' for c in label), label
    assert snap.total_drafted == 601


def test_agent_labels_off_and_scope_labels_on() -> None:
    m = DrafterMetrics(prometheus=False, labels="scope")
    assert m.agent_label("secret-agent") == "tagged" and m.agent_label(None) == "untagged"
    scopes = [m.scope_label(f"tenant-{i}") for i in range(MAX_SCOPE_LABELS + 10)]
    assert scopes[0] == "tenant-0" and scopes[-1] == "other"
    assert m.scope_label(None) == "other"  # the cap is reached
    assert DrafterMetrics(prometheus=False, labels="scope").scope_label(None) == "default"
    m.record_verified("tagged", "none", 3, 2, scope="tenant-0")
    snap = m.snapshot()
    assert snap.scope_drafted == {"tenant-0": 3} and snap.scope_accepted == {"tenant-0": 2}
    off = DrafterMetrics(prometheus=False, labels="agent")
    assert off.scope_label("tenant-0") is None


def test_labels_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LABELS_ENV, "none")
    assert DrafterMetrics(prometheus=False).agent_label("a") == "tagged"
    monkeypatch.setenv(LABELS_ENV, "agent,scope")
    assert DrafterMetrics(prometheus=False).labels == {"agent", "scope"}
    monkeypatch.delenv(LABELS_ENV)
    assert DrafterMetrics(prometheus=False).labels == {"agent"}
    with pytest.raises(ValueError, match="unknown"):
        parse_labels("agent,tenant")


def test_fixed_block_names_cover_the_default_grammar() -> None:
    from agentspec_mw.agentspec.blocks import DEFAULT_BLOCKS, ROOT
    from agentspec_mw.tags import SEGMENTS
    from agentspec_mw_vllm.metrics import _FIXED_BLOCKS

    assert {ROOT, "none", *SEGMENTS, *(b.name for b in DEFAULT_BLOCKS)} <= _FIXED_BLOCKS
