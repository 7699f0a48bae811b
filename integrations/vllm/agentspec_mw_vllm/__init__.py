"""AgentSpec-MW for vLLM: general plugin, ``custom_class`` drafter, embedded engine, server.

One import line for users::

    from agentspec_mw_vllm import build_llm, shutdown, get_metrics

See docs/vllm.md.
"""

from agentspec_mw_vllm.adapter import AgentSpecDrafter
from agentspec_mw_vllm.config import DrafterConfig
from agentspec_mw_vllm.engine import ADAPTER_PATH, build_async_llm, build_llm, shutdown
from agentspec_mw_vllm.metrics import MetricsSnapshot, get_metrics

__all__ = [
    "ADAPTER_PATH",
    "AgentSpecDrafter",
    "DrafterConfig",
    "MetricsSnapshot",
    "build_async_llm",
    "build_llm",
    "get_metrics",
    "shutdown",
]
