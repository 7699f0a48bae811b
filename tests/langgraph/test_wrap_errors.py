"""``with_agentspec`` fails early with a ``TypeError`` that says what to pass; the old
config name still imports, with a warning; the engine-backed model counts as delivered."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from agentspec_mw_langgraph import ChatAgentSpecVLLM, TaggingConfig, get_handler, with_agentspec

from .fake_chat import ScriptedChatModel
from .fake_engine import FakeBackend


def scripted() -> ScriptedChatModel:
    return ScriptedChatModel(script=lambda messages, tools: AIMessage("ok"))


def builder(model: Any = None) -> StateGraph[Any]:
    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])] if model else []}

    g = StateGraph(MessagesState)
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    return g


@pytest.mark.parametrize(
    ("graph", "match"),
    [
        (builder(), r"call \.compile\(\) first"),
        (scripted(), r"chat model \(ScriptedChatModel\).*create_agent"),
        (None, "compiled LangGraph graph"),
        ("graph", "compiled LangGraph graph"),
    ],
    ids=["state-graph", "chat-model", "none", "str"],
)
def test_not_a_compiled_graph(graph: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        with_agentspec(graph)


def test_dict_config_names_the_class() -> None:
    with pytest.raises(TypeError, match=r"dict: pass TaggingConfig\(\*\*\.\.\.\)"):
        with_agentspec(builder().compile(), config={"tags_scope": "t"})  # type: ignore[arg-type]


def test_proposer_config_is_sent_to_the_engine() -> None:
    from agentspec_mw.agentspec.config import AgentSpecConfig as ProposerConfig

    with pytest.raises(TypeError, match=r"proposer's .*build_llm\(proposer_options="):
        with_agentspec(builder().compile(), config=ProposerConfig())  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", [12345, 1.5, {"url": "http://x"}, ["http://x"], b"http://x"])
def test_wrong_engine_type(engine: Any) -> None:
    with pytest.raises(TypeError, match=r"is not an engine: pass the vLLM server's"):
        with_agentspec(builder().compile(), engine=engine)


def test_engine_objects_are_accepted(tiny_tokenizer: Any) -> None:
    backend = FakeBackend(tiny_tokenizer, lambda prompt: "ok")
    for engine in (backend, ChatAgentSpecVLLM(engine=backend), "http://127.0.0.1:9/v1"):
        assert get_handler(with_agentspec(builder().compile(), engine=engine)) is not None


def test_old_config_name_warns_and_still_works() -> None:
    with pytest.warns(DeprecationWarning, match="now TaggingConfig"):
        from agentspec_mw_langgraph import AgentSpecConfig
    assert AgentSpecConfig is TaggingConfig
    with pytest.warns(DeprecationWarning, match="now TaggingConfig"):
        from agentspec_mw_langgraph.config import AgentSpecConfig as again
    assert again is TaggingConfig


def test_engine_backed_model_counts_delivered_tags(
    tiny_tokenizer: Any, strict: TaggingConfig
) -> None:
    backend = FakeBackend(tiny_tokenizer, lambda prompt: "ok")
    app = with_agentspec(
        builder(ChatAgentSpecVLLM(engine=backend, max_tokens=4)).compile(), config=strict
    )
    app.invoke({"messages": [HumanMessage("q")]})
    plain = with_agentspec(builder(scripted()).compile(), config=strict)
    plain.invoke({"messages": [HumanMessage("q")]})
    engine_stats, plain_stats = get_handler(app).stats, get_handler(plain).stats  # type: ignore[union-attr]
    assert (engine_stats.tags_derived, engine_stats.tags_delivered) == (1, 1)
    assert (plain_stats.tags_derived, plain_stats.tags_delivered) == (1, 0)  # nobody sent them
    assert engine_stats.tagged_calls == engine_stats.tags_derived  # the former name
