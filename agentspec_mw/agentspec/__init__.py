"""The AgentSpec proposer: structure-isolated drafting with a cost-model budget.

Modules, one job each: :mod:`.proposer` (the lifecycle and each step's orchestration),
:mod:`.identity` (who a request is; index key bases), :mod:`.calibration` (calibrated
acceptance), :mod:`.budget` (which draft positions pay under the step-time model),
:mod:`.kernels` (the per-step numba kernels), :mod:`.workspace` (their named per-step
arrays), :mod:`.slots` (per-request rows), :mod:`.scopes` (per-scope learned state),
:mod:`.ngram_index` (the history index), :mod:`.blocks` and :mod:`.grammars` (block
kinds), :mod:`.lookup` (the ``local`` source), :mod:`.token_classes`.
"""

from agentspec_mw.agentspec.blocks import DEFAULT_BLOCKS, BlockGrammar, BlockSpec, BlockState
from agentspec_mw.agentspec.budget import Allocation, allocate
from agentspec_mw.agentspec.calibration import SOURCES, redundancy_score
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.grammars import MAX_GRAMMARS
from agentspec_mw.agentspec.proposer import AgentSpecProposer

__all__ = [
    "DEFAULT_BLOCKS",
    "MAX_GRAMMARS",
    "SOURCES",
    "AgentSpecConfig",
    "AgentSpecProposer",
    "Allocation",
    "BlockGrammar",
    "BlockSpec",
    "BlockState",
    "allocate",
    "redundancy_score",
]
