"""arctic-inference's native suffix tree, kept for comparison benchmarks.

The AgentSpec proposer's history lives in :mod:`~agentspec_mw.agentspec.ngram_index`. A
first version kept one arctic-inference ``SuffixTree`` per key (the structure
SuffixDecoding uses; arctic-inference exposes it as ``suffix_decoding._C.SuffixTree`` and
this project pins arctic-inference 0.3.0); ``benchmarks/index_speed.py`` measures why that
was too slow per call for a 256-request step.
"""

from __future__ import annotations

from typing import Any

from agentspec_mw.errors import MissingDependencyError

__all__ = ["new_tree"]


def new_tree(depth: int) -> Any:
    """A fresh native suffix tree of the given depth."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError as exc:
        raise MissingDependencyError(
            "arctic-inference",
            "arctic-inference's suffix tree",
            "pip install arctic-inference==0.3.0",
        ) from exc
    return SuffixTree(depth)
