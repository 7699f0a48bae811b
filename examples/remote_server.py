"""Point a LangGraph agent at a remote vLLM server running the AgentSpec drafter.

Start the server (on the GPU host; see docs/deployment.md)::

    agentspec serve --model Qwen/Qwen2.5-7B-Instruct --port 8000 \\
        -- --enable-auto-tool-choice --tool-call-parser hermes

(the agent calls a tool: vLLM answers a request with tools only with a tool parser, which
``agentspec serve`` sets by itself for the default model alone)

then, anywhere that can reach it::

    python examples/remote_server.py --base-url http://HOST:8000/v1 \\
        --model Qwen/Qwen2.5-7B-Instruct "What is 12 * 34?"

The model is a plain ``ChatOpenAI``; ``with_agentspec(graph, engine=base_url)`` makes
every request it sends to that server carry the structure tags as ``vllm_xargs``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.tools import tool

from agentspec_mw_langgraph import get_handler, with_agentspec


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def build_app(base_url: str, model: str, **chat_kwargs: Any) -> Any:
    """A ``create_agent`` graph on ``ChatOpenAI(base_url=...)``, wrapped with AgentSpec.

    ``chat_kwargs`` go to ``ChatOpenAI`` (e.g. ``max_tokens``, ``http_client``).
    """
    from langchain_openai import ChatOpenAI

    chat_kwargs.setdefault("api_key", "unused")  # vLLM ignores it unless --api-key is set
    chat_kwargs.setdefault("temperature", 0)
    llm = ChatOpenAI(model=model, base_url=base_url, **chat_kwargs)
    agent = create_agent(
        llm,
        tools=[multiply],
        middleware=[ModelCallLimitMiddleware(run_limit=4, exit_behavior="end")],
    )
    return with_agentspec(agent, engine=base_url)


def main(argv: list[str] | None = None) -> int:
    """Ask the agent one question and print the answer and the tagged-call count."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("question", nargs="?", default="What is 12 * 34?")
    p.add_argument("--base-url", required=True, help="the server's OpenAI base URL (…/v1)")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--max-tokens", type=int, default=256)
    args = p.parse_args(argv)
    app = build_app(args.base_url, args.model, max_tokens=args.max_tokens)
    result = app.invoke({"messages": [("user", args.question)]})
    print(result["messages"][-1].content)
    handler = get_handler(app)
    assert handler is not None
    stats = handler.stats
    print(f"{stats.tags_delivered}/{stats.llm_calls} LLM calls sent to {args.base_url} with tags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
