"""Tag a ``create_agent`` agent with ``AgentSpecMiddleware`` and run it on ``agentspec serve``.

Start the server (the default model, with tool calling on)::

    agentspec serve --port 8000

then::

    python examples/agent_middleware.py --base-url http://127.0.0.1:8000/v1

The agent is ordinary LangChain code; the AgentSpec line is the middleware, which puts
each model call's structure tags into the request to the ``engine=`` server
(``vllm_xargs``) and into the model run's metadata. It goes last in ``middleware=[...]``,
so that it tags the request that goes out after the other middleware changed it.
``with_agentspec(agent, engine=base_url)`` does the same from outside
(examples/remote_server.py). The tiny default model calls a tool only after an example
exchange, so the conversation starts with one; a larger model does not need it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ModelCallLimitMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agentspec_mw_langgraph import AgentSpecMiddleware, TaggingConfig


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"rain, 12 C in {city}"


def conversation(question: str) -> list[BaseMessage]:
    """One example exchange (a tool call and its answer), then ``question``."""
    call = {"name": "get_weather", "args": {"city": "Rome"}, "id": "example-1"}
    return [
        HumanMessage("What is the weather in Rome?"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("sunny", tool_call_id="example-1"),
        AIMessage("It is sunny in Rome."),
        HumanMessage(question),
    ]


def build_agent(
    base_url: str, model: str, scope: str = "default", **chat_kwargs: Any
) -> tuple[Any, AgentSpecMiddleware]:
    """A ``create_agent`` agent on ``ChatOpenAI(base_url=...)`` with ``AgentSpecMiddleware``,
    and the middleware (its ``stats`` count the tagged calls).

    ``chat_kwargs`` go to ``ChatOpenAI`` (e.g. ``max_tokens``, ``http_client``).
    """
    from langchain_openai import ChatOpenAI

    chat_kwargs.setdefault("api_key", "unused")  # vLLM ignores it unless --api-key is set
    chat_kwargs.setdefault("temperature", 0)
    llm = ChatOpenAI(model=model, base_url=base_url, **chat_kwargs)
    tagging = AgentSpecMiddleware(TaggingConfig(tags_scope=scope), engine=base_url)
    agent = create_agent(
        llm,
        tools=[get_weather],
        # a small model can call tools forever: stop after two model calls; the tagging
        # middleware goes last, to tag the model call as the middleware before it leave it
        middleware=[ModelCallLimitMiddleware(run_limit=2, exit_behavior="end"), tagging],
    )
    return agent, tagging


def main(argv: list[str] | None = None) -> int:
    """Ask the agent one question; print the conversation and the tag counters."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("question", nargs="?", default="What is the weather in Paris?")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="the served model name")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    agent, tagging = build_agent(args.base_url, args.model, max_tokens=args.max_tokens)
    result = agent.invoke({"messages": conversation(args.question)})
    for message in result["messages"][4:]:
        calls = getattr(message, "tool_calls", None) or ""
        print(f"{message.type:>6}: {str(message.content)[:200]!r} {calls}")
    stats = tagging.stats
    print(f"{stats.tags_delivered}/{stats.model_calls} model calls sent with tags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
