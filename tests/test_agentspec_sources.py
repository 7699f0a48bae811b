"""AgentSpec's ``local`` source: what it drafts from a request's own prompt and output."""

from __future__ import annotations

import numpy as np

from agentspec_mw.agentspec import AgentSpecProposer
from agentspec_mw.agentspec.calibration import MATCH_EDGES, SOURCES
from agentspec_mw.agentspec.ngram_index import LEVELS
from agentspec_mw.costmodel import PRESETS
from agentspec_mw.proposer import ProposerEnv, StepContext

_LOCAL = SOURCES.index("local")


def _proposer() -> AgentSpecProposer:
    env = ProposerEnv(
        token_bytes=[bytes([i]) for i in range(256)],
        cost_model=PRESETS["llama8b-h100"],
        max_k=8,
    )
    p = AgentSpecProposer(env)
    p.candidates = {}
    return p


def _local_candidate(p: AgentSpecProposer, req: str, k: int = 8) -> list[int]:
    p.propose([req], k, StepContext(batch_size=1, num_kv_tokens=64))
    assert p.candidates is not None
    if "tok" not in p.candidates:  # no source had a candidate
        return []
    row = _LOCAL * 1 + 0  # one request: the local row is the source's index
    return p.candidates["tok"][row, : p.candidates["lens"][row]].tolist()


def test_local_drafts_after_a_one_token_match_of_the_prompt() -> None:
    """An answer naming what its prompt named: after one shared token, the prompt's
    continuation is the local candidate (SuffixDecoding's prompt tree drafts it too;
    ``local`` used to need 3 tokens)."""
    p = _proposer()
    p.start("r", np.array([*b"Write about: ink, 42 kinds."], dtype=np.int32))
    p.extend("r", [*b"The"])
    p.extend("r", [*b"-"])  # no match at all: nothing to draft
    assert _local_candidate(p, "r") == []
    p.extend("r", [*b"4"])  # "-4" is not in the prompt, "4" is: a 1-token match
    for _ in range(16):  # the scan that found nothing backs off; wait it out
        if _local_candidate(p, "r"):
            break
    assert _local_candidate(p, "r")[:7] == [*b"2 kinds"]


def test_one_token_matches_have_their_own_calibration_bucket() -> None:
    """Match length 1 (only ``local`` has it) is calibrated apart from the index's
    shortest level: its evidence is weaker."""
    assert MATCH_EDGES[0] == 1
    assert MATCH_EDGES[1:].tolist() == list(LEVELS)
    assert min(LEVELS) == 2
