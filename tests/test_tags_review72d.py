"""Review 72d: wire-tag errors name every problem, plainly, and say what to send."""

from __future__ import annotations

import pytest

from agentspec_mw.errors import TagError
from agentspec_mw.tags import tags_from_wire


def test_every_invalid_field_is_reported_at_once() -> None:
    """A request with two bad fields hears of both (not one per round trip)."""
    wire = {"agentspec_v": 1, "agentspec_segment": "Plan", "agentspec_scope": "x" * 300}
    with pytest.raises(TagError) as info:
        tags_from_wire(wire)
    message = str(info.value)
    assert "segment:" in message and "scope:" in message, message


def test_model_level_errors_lose_pydantics_prefix() -> None:
    with pytest.raises(TagError) as info:
        tags_from_wire({"agentspec_v": 1, "agentspec_agent": "a"})
    message = str(info.value)
    assert "Value error" not in message, message
    assert "agent_id and query_id go together" in message


def test_missing_version_says_it_is_missing() -> None:
    """``agentspec_scope`` alone: the version key is missing, not an unsupported version."""
    with pytest.raises(TagError, match="agentspec_v is missing") as info:
        tags_from_wire({"agentspec_scope": "t1"})
    assert "agentspec_v=1" in str(info.value)


def test_version_sent_as_a_string_is_named() -> None:
    with pytest.raises(TagError, match="send the int 1, not the string"):
        tags_from_wire({"agentspec_v": "1", "agentspec_scope": "t1"})


def test_valid_tags_still_decode() -> None:
    tags = tags_from_wire({"agentspec_v": 1, "agentspec_scope": "t1"})
    assert tags is not None and tags.scope == "t1" and tags.scope_only
