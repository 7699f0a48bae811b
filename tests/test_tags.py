"""Structure tags, their flat wire encoding, and the proposer registry."""

from __future__ import annotations

import pytest

from agentspec_mw.errors import ProposerLoadError, TagError
from agentspec_mw.peers.none import NoProposer
from agentspec_mw.registry import make_proposer, resolve_proposer_class
from agentspec_mw.tags import StructureTags, tags_from_wire, tags_to_wire


def test_wire_round_trip_is_flat() -> None:
    tags = StructureTags(
        scope="tenant-a",
        agent_id="planner",
        query_id="run-1",
        segment="tool_call",
        blocks=(("<tool_call>", "</tool_call>"),),
        group_id="g1",
        group_kind="fanout",
    )
    wire = tags_to_wire(tags)
    assert all(isinstance(v, str | int | float) for v in wire.values())
    assert tags_from_wire({**wire, "other_key": 1}) == tags


def test_no_tags_means_none() -> None:
    assert tags_from_wire(None) is None
    assert tags_from_wire({"temperature_hint": 1}) is None


@pytest.mark.parametrize(
    "wire,match",
    [
        ({"agentspec_v": 2, "agentspec_agent": "a", "agentspec_query": "q"}, "version"),
        ({"agentspec_v": 1, "agentspec_query": "q"}, "agent_id"),
        (
            {"agentspec_v": 1, "agentspec_agent": "a", "agentspec_query": "q", "agentspec_x": 1},
            "unknown",
        ),
        (
            {
                "agentspec_v": 1,
                "agentspec_agent": "a",
                "agentspec_query": "q",
                "agentspec_blocks": "[1]",
            },
            "pairs",
        ),
        (
            {
                "agentspec_v": 1,
                "agentspec_agent": "a",
                "agentspec_query": "q",
                "agentspec_blocks": "{",
            },
            "JSON",
        ),
        ({"agentspec_v": 1, "agentspec_agent": ["a"], "agentspec_query": "q"}, "flat|str, int"),
        ({"agentspec_v": 1, "agentspec_agent": "a" * 9000, "agentspec_query": "q"}, "over"),
        (
            {
                "agentspec_v": 1,
                "agentspec_agent": "a",
                "agentspec_query": "q",
                "agentspec_segment": "poem",
            },
            "segment",
        ),
    ],
)
def test_malformed_wire_tags_raise_tag_error(wire: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(TagError, match=match):
        tags_from_wire(wire)


def test_registry_builtins_and_dotted_paths() -> None:
    assert resolve_proposer_class("none") is NoProposer
    assert resolve_proposer_class("agentspec_mw.peers.none.NoProposer") is NoProposer
    assert isinstance(make_proposer("agentspec_mw.peers.none:NoProposer"), NoProposer)
    with pytest.raises(ProposerLoadError, match="neither a builtin"):
        resolve_proposer_class("bogus")
    with pytest.raises(ProposerLoadError, match="cannot import"):
        resolve_proposer_class("no_such_pkg.Thing")
    with pytest.raises(ProposerLoadError, match="lacks the Proposer verbs"):
        make_proposer("agentspec_mw.errors.AgentSpecError")


def test_bad_proposer_options_are_reported() -> None:
    with pytest.raises(ProposerLoadError, match="bad options"):
        make_proposer("ngram", prompt_lookup_min=0)
