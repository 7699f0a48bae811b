"""Fuzzed wire tags: decoding returns tags or raises :class:`TagError`, nothing else.

The corpus is built here from a fixed seed (a few thousand cases, well under a second):
hostile values of every wire key (lone surrogates, control bytes, huge ints, NaN, nested
brackets, over-long delimiters, non-flat values) and mutations of valid tags. Every tag set
that decodes must round-trip through :func:`tags_to_wire` and compile as the proposer's
block grammar, so no request's tags can reach a proposer that then fails on them.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from agentspec_mw.errors import TagError
from agentspec_mw.tags import SEGMENTS, StructureTags, tags_from_wire, tags_to_wire

SEED = 20261202
N_RANDOM = 2500
N_MUTATED = 1500
KEYS = ("v", "scope", "agent", "query", "segment", "blocks", "group", "group_kind", "x")
ATOMS = ("[", "]", "{", "}", '"', "\\", ",", ":", "ü", "€", "\x00", "\x1b", "\ud800", "a")


def _text(rng: random.Random, max_len: int = 80) -> str:
    """Random text biased toward what breaks parsers and encoders."""
    pool = [
        lambda: chr(rng.randrange(0x20, 0x7F)),
        lambda: chr(rng.randrange(0, 0x20)),
        lambda: chr(rng.randrange(0xD800, 0xE000)),  # surrogates
        lambda: chr(rng.randrange(0x80, 0x800)),
        lambda: chr(rng.randrange(0x10000, 0x10FFFF)),
        lambda: rng.choice(ATOMS),
    ]
    return "".join(rng.choice(pool)() for _ in range(rng.randrange(0, max_len)))


def _blocks_text(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:  # deep nesting
        return rng.choice("[{") * rng.randrange(1, 6000)
    if kind == 1:  # well-formed pairs of random delimiters (some too long in bytes)
        pairs = [[_text(rng, 70), _text(rng, 70)] for _ in range(rng.randrange(0, 40))]
        return json.dumps(pairs, ensure_ascii=rng.random() < 0.5)
    if kind == 2:  # random JSON values
        return json.dumps(rng.choice([[], {}, [[]], [["a"]], [["a", 1]], [[None, "b"]], 3, "s"]))
    if kind == 3:  # escaped lone surrogates inside valid JSON
        return f'[["\\ud8{rng.randrange(256):02x}", "\\udc00"]]'
    if kind == 4:  # huge number literals
        return "[[" + "9" * rng.randrange(1, 6000) + ', "x"]]'
    if kind == 5:
        return "[" * rng.randrange(1, 4) + _text(rng, 200) + "]" * rng.randrange(0, 4)
    return _text(rng, 300)


def _value(rng: random.Random, key: str) -> Any:
    kind = rng.randrange(12)
    if key == "blocks" and kind < 6:
        return _blocks_text(rng)
    if key == "v" and kind < 4:
        return rng.choice([1, 1, 1.0, "1", True])
    choices: list[Any] = [
        lambda: _text(rng),
        lambda: "x" * rng.randrange(8000, 9000) + _text(rng, 10),  # over the size limit
        lambda: rng.randrange(-(10**6), 10**6),
        lambda: 10 ** rng.randrange(1, 9000),  # str() refuses over 4300 digits
        lambda: float("nan"),
        lambda: float("inf"),
        lambda: -0.0,
        lambda: True,
        lambda: None,
        lambda: [_text(rng, 5)],
        lambda: {"k": 1},
        lambda: rng.choice(SEGMENTS + ("fanout", "retry", "poem", "")),
    ]
    return rng.choice(choices)()


def _random_wire(rng: random.Random) -> dict[Any, Any]:
    wire: dict[Any, Any] = {"agentspec_v": 1} if rng.random() < 0.8 else {}
    for key in rng.sample(KEYS, rng.randrange(0, len(KEYS))):
        wire[f"agentspec_{key}"] = _value(rng, key)
    if rng.random() < 0.1:
        wire[rng.choice([_text(rng, 10), 7, None])] = "other"
    return wire


def _valid_tags(rng: random.Random) -> StructureTags:
    named = rng.random() < 0.6
    blocks = None
    if rng.random() < 0.5:
        ascii_delim = lambda: "".join(chr(rng.randrange(0x21, 0x7F)) for _ in range(8))  # noqa: E731
        blocks = tuple((ascii_delim(), ascii_delim()) for _ in range(rng.randrange(1, 5)))
    return StructureTags(
        scope=rng.choice(["default", "t1", "tenant-β"]),
        agent_id=f"agent{rng.randrange(9)}" if named else None,
        query_id=f"q{rng.randrange(99)}" if named else None,
        segment=rng.choice([None, *SEGMENTS]),  # type: ignore[arg-type]
        blocks=blocks,
        group_id=rng.choice([None, "g1"]),
    )


def _mutated_wire(rng: random.Random) -> dict[Any, Any]:
    wire: dict[Any, Any] = dict(tags_to_wire(_valid_tags(rng)))
    for _ in range(rng.randrange(1, 3)):
        key = f"agentspec_{rng.choice(KEYS)}"
        if rng.random() < 0.3 and key in wire:
            del wire[key]
        else:
            wire[key] = _value(rng, key.removeprefix("agentspec_"))
    return wire


def _corpus() -> list[dict[Any, Any]]:
    rng = random.Random(SEED)
    return [_random_wire(rng) for _ in range(N_RANDOM)] + [
        _mutated_wire(rng) for _ in range(N_MUTATED)
    ]


def _grammar_accepts(tags: StructureTags) -> None:
    """The proposer's own check: the block grammar compiles these delimiters."""
    from agentspec_mw.agentspec.blocks import BlockGrammar, BlockSpec

    assert tags.blocks is not None
    specs = [BlockSpec(f"b{i}", s, e) for i, (s, e) in enumerate(tags.blocks)]
    BlockGrammar(specs, [bytes([b]) for b in range(256)])


def test_fuzzed_wire_tags_decode_or_raise_tag_error_only() -> None:
    outcomes = {"tags": 0, "none": 0, "rejected": 0}
    for wire in _corpus():
        try:
            tags = tags_from_wire(wire)
        except TagError:
            outcomes["rejected"] += 1
            continue
        if tags is None:
            outcomes["none"] += 1
            continue
        outcomes["tags"] += 1
        assert tags_from_wire(tags_to_wire(tags)) == _sent(tags)
        for value in tags_to_wire(tags).values():
            if isinstance(value, str):
                value.encode("utf-8")  # no lone surrogates survive decoding
        if tags.blocks is not None:
            _grammar_accepts(tags)
    # the corpus exercises all three outcomes, mostly rejections
    assert outcomes["tags"] >= 100 and outcomes["none"] >= 50, outcomes
    assert outcomes["rejected"] >= N_RANDOM // 2, outcomes


def _sent(tags: StructureTags) -> StructureTags:
    """What crosses the wire: all but ``group_kind`` (client-side only)."""
    return tags.model_copy(update={"group_kind": None})


def test_valid_tags_round_trip() -> None:
    rng = random.Random(SEED + 1)
    for _ in range(500):
        tags = _valid_tags(rng)
        assert tags_from_wire(tags_to_wire(tags)) == _sent(tags)
        assert tags_from_wire(json.loads(json.dumps(tags_to_wire(tags)))) == _sent(tags)


@pytest.mark.parametrize(
    "blocks",
    ["[" * 5000, "[]", json.dumps([["ü" * 40, "x"]]), '[["\\ud800", "x"]]'],
    ids=["deep", "empty", "80-bytes", "surrogate"],
)
def test_the_reported_poisoning_blocks_are_rejected(blocks: str) -> None:
    with pytest.raises(TagError):
        tags_from_wire({"agentspec_v": 1, "agentspec_blocks": blocks})


@pytest.mark.parametrize(
    "blocks",
    [(), (("ü" * 40, "x"),), (("\ud800", "x"),), (("", "x"),)],
    ids=["empty", "80-bytes", "surrogate", "empty-delimiter"],
)
def test_langgraph_tagging_config_checks_blocks_like_the_wire(blocks: Any) -> None:
    """A LangGraph app cannot configure delimiters its own tags would then fail on."""
    from pydantic import ValidationError

    from agentspec_mw_langgraph import TaggingConfig

    with pytest.raises(ValidationError, match="tags_blocks"):
        TaggingConfig(tags_blocks=blocks)
