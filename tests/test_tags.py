"""Structure tags, their flat wire encoding, and the proposer registry."""

from __future__ import annotations

import json

import numpy as np
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
    assert "agentspec_group_kind" not in wire  # client-side only (no proposer reads it)
    assert tags_from_wire({**wire, "other_key": 1}) == tags.model_copy(update={"group_kind": None})
    older = {**wire, "agentspec_group_kind": "fanout"}  # an older client still decodes
    assert tags_from_wire(older) == tags


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
        # an empty scope is a client's bug (an unset variable), not a tenant: refused, as
        # an empty agent or query is and as the LangGraph side's `tags_scope` is
        ({"agentspec_v": 1, "agentspec_scope": ""}, "scope: String should have at least 1"),
        (
            {
                "agentspec_v": 1,
                "agentspec_scope": "",
                "agentspec_agent": "a",
                "agentspec_query": "q",
            },
            "scope",
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


def test_scope_only_tags_round_trip_and_omit_none_fields() -> None:
    tags = tags_from_wire({"agentspec_v": 1, "agentspec_scope": "t1"})
    assert tags == StructureTags(scope="t1")
    assert tags is not None and tags.scope_only
    assert (tags.agent_id, tags.query_id) == (None, None)
    assert tags_to_wire(tags) == {"agentspec_v": 1, "agentspec_scope": "t1"}
    with_blocks = StructureTags(scope="t1", blocks=(("<a>", "</a>"),), segment="plan")
    assert tags_from_wire(tags_to_wire(with_blocks)) == with_blocks
    assert not StructureTags(agent_id="a", query_id="q").scope_only


def test_agent_and_query_go_together() -> None:
    with pytest.raises(ValueError, match="go together"):
        StructureTags(agent_id="a")
    with pytest.raises(TagError, match="go together"):
        tags_from_wire({"agentspec_v": 1, "agentspec_agent": "a"})


def _blocks_wire(blocks: str) -> dict[str, str | int | float]:
    return {"agentspec_v": 1, "agentspec_scope": "s", "agentspec_blocks": blocks}


@pytest.mark.parametrize(
    "blocks,match",
    [
        ("[" * 5000, "brackets deep"),  # json.loads would raise RecursionError
        ("[[[" + '"a"' + "]]]", "brackets deep"),
        ("[]", "at least one"),
        (json.dumps([["ü" * 40, "x"]]), "1..64 UTF-8 bytes, got 80"),  # 40 chars, 80 bytes
        (json.dumps([["", "x"]]), "1..64 UTF-8 bytes, got 0"),
        (json.dumps([["a", "b"]] * 33), "over 32"),
        ('[["\\ud800", "x"]]', "UTF-8"),  # a lone surrogate, escaped in the JSON text
        ('[["1e99999999999999", "x"]', "not JSON"),
        ("[[" + "1" * 5000 + ', "x"]]', "not JSON|pairs"),  # an over-long int literal
    ],
)
def test_blocks_are_checked_like_the_block_grammar(blocks: str, match: str) -> None:
    with pytest.raises(TagError, match=match):
        tags_from_wire(_blocks_wire(blocks))


def test_delimiter_limit_counts_bytes_not_chars() -> None:
    ok = StructureTags(blocks=(("ü" * 32, "€" * 21),))  # 64 and 63 bytes
    assert tags_from_wire(tags_to_wire(ok)) == ok
    brackets_in_strings = StructureTags(blocks=(("[[[[", "]]]]"), ("{{", "}}")))
    assert tags_from_wire(tags_to_wire(brackets_in_strings)) == brackets_in_strings


@pytest.mark.parametrize("field", ["scope", "agent", "query", "group"])
def test_lone_surrogates_anywhere_are_tag_errors(field: str) -> None:
    wire: dict[str, str | int | float] = {
        "agentspec_v": 1,
        "agentspec_agent": "a",
        "agentspec_query": "q",
    }
    wire[f"agentspec_{field}"] = "x\udcff"
    with pytest.raises(TagError):
        tags_from_wire(wire)


class _Exploding(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    "extra",
    [
        {"agentspec_v": 10**5000},  # str() of it raises ValueError
        {"agentspec_v": 1, "agentspec_agent": 10**9000, "agentspec_query": "q"},
        {"agentspec_v": float("nan")},
        {"agentspec_v": 1, "agentspec_blocks": 7},
        _Exploding({"agentspec_v": 1}),
    ],
)
def test_hostile_values_only_ever_raise_tag_error(extra: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(TagError):
        tags_from_wire(extra)


def test_repeated_wire_tags_are_decoded_once_and_typed_apart() -> None:
    """The same tag set decodes to one shared (immutable) object; a value of another type
    that compares equal (``True == 1 == 1.0``) is decoded on its own, so it is refused or
    read as itself, never answered from the other's entry."""
    wire = tags_to_wire(StructureTags(agent_id="planner", query_id="7", segment="plan"))
    first = tags_from_wire(dict(wire))
    assert tags_from_wire(dict(wire)) is first
    assert first is not None and first.query_id == "7"
    assert tags_from_wire({**wire, "agentspec_query": 7.0}).query_id == "7.0"  # type: ignore[union-attr]
    assert tags_from_wire({**wire, "agentspec_query": 7}).query_id == "7"  # type: ignore[union-attr]
    with pytest.raises(TagError):
        tags_from_wire({**wire, "agentspec_v": True})  # the version 1 is cached, True is refused
    # equal floats that read differently are different scopes (tenants)
    assert tags_from_wire({**wire, "agentspec_scope": 0.0}).scope == "0.0"  # type: ignore[union-attr]
    assert tags_from_wire({**wire, "agentspec_scope": -0.0}).scope == "-0.0"  # type: ignore[union-attr]
    for value in (np.float64(-0.0), np.float64(0.0)):  # a float subclass: keyed by repr too
        tags = tags_from_wire({**wire, "agentspec_scope": value})
        assert tags is not None and tags.scope == str(value)
    with pytest.raises(TagError):  # an unhashable value is still refused
        tags_from_wire({**wire, "agentspec_blocks": [["<a>", "</a>"]]})
