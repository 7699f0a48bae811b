"""The engine traces kept in benchmarks/traces load as traces and say what their README says."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from agentspec_mw.traces.loader import iter_records

TRACES = Path(__file__).resolve().parent.parent / "benchmarks" / "traces"

# (calls, runs, the agent with most calls) as benchmarks/traces/README.md lists them
EXPECTED = {
    "demo": (735, 96, "worker"),
    "map_reduce": (640, 64, "analyst"),
    "supervisor_team": (598, 64, "supervisor"),
    "tool_loop": (127, 64, "model"),
    "reflect": (384, 64, "reviewer"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engine_trace_loads_strictly_and_matches_its_readme(name: str) -> None:
    records = list(iter_records(TRACES / f"engine_{name}.jsonl.xz"))
    calls, runs, top = EXPECTED[name]
    assert len(records) == calls
    assert len({r.run_id for r in records}) == runs
    assert Counter(r.agent for r in records).most_common(1)[0][0] == top
    assert all(r.output for r in records)
    assert (
        sum(r.source == "agentspec-mw-langgraph" for r in records) == calls
    )  # tagged by the adapter


def test_every_engine_trace_is_listed() -> None:
    on_disk = {
        p.name.removeprefix("engine_").removesuffix(".jsonl.xz") for p in TRACES.glob("*.xz")
    }
    assert on_disk == set(EXPECTED)
    readme = (TRACES / "README.md").read_text()
    assert all(f"`engine_{name}.jsonl.xz`" in readme for name in EXPECTED)
