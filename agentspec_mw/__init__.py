"""AgentSpec-MW: speculative decoding middleware for batch inference of LLM agents."""
