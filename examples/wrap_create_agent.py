"""Wrap a ``create_agent`` graph with AgentSpec and run it on the embedded engine.

    python examples/wrap_create_agent.py "What is 12 * 34?"

The agent is ordinary LangChain code; the only AgentSpec lines are the chat model (the
in-process vLLM engine with the AgentSpec drafter, default model SmolLM2-135M) and
``with_agentspec``. After the run it prints the engine's per-agent draft counters.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.tools import tool

from agentspec_mw_langgraph import ChatAgentSpecVLLM, with_agentspec


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def build_app(engine: Any, max_tokens: int = 64) -> Any:
    """A ``create_agent`` graph over the engine, wrapped with ``with_agentspec``."""
    model = ChatAgentSpecVLLM(engine=engine, max_tokens=max_tokens)
    agent = create_agent(
        model,
        tools=[multiply, add],
        system_prompt="You are a calculator assistant. Use the tools.",
        # a small model can call tools forever: stop after three model calls
        middleware=[ModelCallLimitMiddleware(run_limit=3, exit_behavior="end")],
    )
    return with_agentspec(agent)  # <- the one line


def main(argv: list[str] | None = None) -> int:
    """Run the agent on one question and print its answer and the draft counters."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("question", nargs="?", default="What is 12 * 34?")
    p.add_argument("--model", default=None, help="HF model id or folder (default: SmolLM2-135M)")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)

    from agentspec_mw_vllm import build_llm, get_metrics, shutdown

    llm = build_llm(args.model, speculative="agentspec", k=8)
    try:
        app = build_app(llm, args.max_tokens)
        result = app.invoke({"messages": [("user", args.question)]})
        for message in result["messages"]:
            calls = getattr(message, "tool_calls", None) or ""
            print(f"{message.type:>6}: {str(message.content)[:200]!r} {calls}")
        snap = get_metrics().snapshot()
        for key, drafted in sorted(snap.drafted.items()):
            print(f"drafts {key}: {snap.accepted.get(key, 0)}/{drafted} accepted")
    finally:
        shutdown(llm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
