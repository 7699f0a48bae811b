"""AgentSpec-MW for LangGraph (see docs/architecture.md)."""
