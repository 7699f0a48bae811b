"""AgentSpec's ``local`` source: what it drafts from a request's own prompt and output."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.agentspec import AgentSpecProposer
from agentspec_mw.agentspec.calibration import MATCH_EDGES, SOURCES
from agentspec_mw.agentspec.ngram_index import LEVELS, MAX_N, NgramIndex
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
    """Match length 1 (``local``'s scan and the index's shortest level) is calibrated
    apart from longer matches: its evidence is weaker."""
    assert MATCH_EDGES.tolist() == sorted({1, *LEVELS.tolist()})
    assert min(LEVELS) == 1


def test_index_drafts_after_a_one_token_match() -> None:
    """Where no context of 2+ tokens occurred before under the key, the index follows the
    occurrences of the last token alone (as SuffixDecoding's tree matches one token):
    a candidate of match length 1, by majority vote like any other level."""
    ix = NgramIndex(capacity=1 << 12)
    seq = np.array([5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7], dtype=np.int32)
    ix.insert(np.zeros(len(seq), np.int64), np.full(len(seq), ix.new_seq(), np.int64), seq)
    ctx = np.zeros((1, MAX_N), np.int32)
    ctx[0, :2] = [9, 5]  # "9 5" never occurred, "5" three times
    toks, probs, lens, match, support = ix.lookup(np.array([0]), ctx, np.array([2]), 2)
    assert match[0] == 1 and support[0] == 3
    assert toks[0, : lens[0]].tolist() == [6, 7]
    assert probs[0, 1] == pytest.approx(2 / 3)  # 7, 8, 7 follow "5 6"
