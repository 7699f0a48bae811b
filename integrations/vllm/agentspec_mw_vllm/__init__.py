"""AgentSpec-MW for vLLM (see docs/architecture.md)."""
