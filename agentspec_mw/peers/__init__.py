"""Adapters of the peer proposers to the shared :class:`~agentspec_mw.proposer.Proposer`.

* ``none`` — no speculation (the baseline every speedup is a ratio against);
* ``ngram`` — vLLM's own n-gram prompt-lookup kernel (``vllm/v1/spec_decode/ngram_proposer.py``);
* ``suffix`` — SuffixDecoding, arctic-inference's ``SuffixDecodingCache`` driven the way
  vLLM's ``SuffixDecodingProposer`` drives it.
"""

from agentspec_mw.peers.none import NoProposer

__all__ = ["NoProposer"]
