"""The AgentSpec proposer: structure-isolated drafting with a cost-model budget."""

from agentspec_mw.agentspec.blocks import DEFAULT_BLOCKS, BlockGrammar, BlockSpec, BlockState
from agentspec_mw.agentspec.budget import Allocation, allocate
from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.agentspec.proposer import AgentSpecProposer, redundancy_score

__all__ = [
    "DEFAULT_BLOCKS",
    "AgentSpecConfig",
    "AgentSpecProposer",
    "Allocation",
    "BlockGrammar",
    "BlockSpec",
    "BlockState",
    "allocate",
    "redundancy_score",
]
