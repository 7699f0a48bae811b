"""Review 72d: the SuffixDecoding peer drafts what vLLM 0.32's ``SuffixDecodingProposer``
drafts on the same stream (requests that every step schedules), and responses reach the
global tree as they are generated, as its docstring says."""

from __future__ import annotations

import numpy as np
import pytest

from agentspec_mw.proposer import StepContext

pytest.importorskip("arctic_inference")

from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: E402

from agentspec_mw.peers.suffix import SuffixProposer  # noqa: E402

CTX = StepContext(batch_size=1)


class _VllmDriven:
    """``SuffixDecodingProposer.propose`` (vLLM 0.32) reduced to one request's calls: the
    tree starts lazily at the first sampled token, the pattern is the last
    ``max_tree_depth`` tokens of the whole context."""

    def __init__(self, depth: int = 24, factor: float = 1.0, min_prob: float = 0.1) -> None:
        self.cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)
        self.depth, self.factor, self.min_prob = depth, factor, min_prob
        self.tokens: dict[str, list[int]] = {}
        self.prompts: dict[str, int] = {}

    def sampled(self, rid: str, ids: list[int], k: int) -> tuple[int, ...]:
        if rid not in self.cache.active_requests:
            if rid in self.cache.cached_requests:
                self.cache.evict_cached_response(rid)
            prompt = np.array(self.tokens[rid][: self.prompts[rid]], dtype=np.int32)
            self.cache.start_request(rid, prompt)
        self.cache.add_active_response(rid, ids)
        self.tokens[rid] += ids
        num = len(self.tokens[rid])
        pattern = np.array(self.tokens[rid][max(0, num - self.depth) : num], dtype=np.int32)
        draft = self.cache.speculate(
            rid,
            pattern,
            max_spec_tokens=k,
            max_spec_factor=self.factor,
            min_token_prob=self.min_prob,
        )
        return tuple(draft.token_ids)


@pytest.mark.parametrize(("depth", "factor", "min_prob"), [(24, 1.0, 0.1), (8, 2.0, 0.0)])
def test_drafts_match_vllms_driving(depth: int, factor: float, min_prob: float) -> None:
    rng = np.random.default_rng(72)
    ours = SuffixProposer(max_tree_depth=depth, max_spec_factor=factor, min_token_prob=min_prob)
    ref = _VllmDriven(depth, factor, min_prob)
    k = 8
    drafted = 0
    motif = rng.integers(0, 30, 40).tolist()  # repeated text: drafts are long and many
    for call in range(6):
        live: dict[str, list[int]] = {}
        for j in range(3):  # three requests in flight at once
            rid = f"c{call}r{j}"
            prompt = motif[: 10 + call] + rng.integers(0, 30, 5).tolist()
            output = (motif * 3)[j : j + 60]
            ours.start(rid, prompt)
            ref.tokens[rid], ref.prompts[rid] = list(prompt), len(prompt)
            live[rid] = output
        emitted = dict.fromkeys(live, 0)
        while live:
            for rid in list(live):
                out = live[rid]
                # the engine's tokens this step: an accepted prefix of the last draft + 1
                adv = min(int(rng.integers(1, 4)), len(out) - emitted[rid])
                ids = out[emitted[rid] : emitted[rid] + adv]
                emitted[rid] += adv
                ours.extend(rid, ids)
                want = ref.sampled(rid, ids, k)
                if emitted[rid] >= len(out):
                    ours.stop(rid)
                    ref.cache.stop_request(rid)
                    del live[rid]
                    continue
                got = ours.propose([rid], k, CTX)[0].token_ids
                assert got == want, (rid, emitted[rid])
                drafted += len(got)
    assert drafted > 100  # the comparison saw real drafts


def test_responses_reach_the_global_tree_while_they_are_generated() -> None:
    """``add_active_response`` extends the global tree: request b drafts from a's output
    while a is still running (not only once ``stop`` ends it)."""
    prop = SuffixProposer()
    prop.start("a", [100, 101])
    prop.extend("a", [5, 6, 7, 8, 9, 10, 11, 12])
    prop.start("b", [200, 201])
    prop.extend("b", [5, 6, 7])
    assert prop.propose(["b"], 8, CTX)[0].token_ids == (8, 9, 10)  # factor 1 x match 3
    prop.stop("a")
    assert prop.propose(["b"], 8, CTX)[0].token_ids == (8, 9, 10)  # still there after stop
