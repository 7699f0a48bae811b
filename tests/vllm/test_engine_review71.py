"""Session 71's review of the engine factory: ``cost_model`` / ``proposer_options`` with a
``speculative`` that runs none of this project's proposers (``None``, vLLM's ``ngram`` /
``suffix``) are refused, not silently dropped, as docs/vllm.md says and ``agentspec
serve`` does (no engine started). The refusals failed before the fix."""

from __future__ import annotations

from typing import Any

import pytest

from agentspec_mw_vllm.engine import check_drafter_options, engine_kwargs
from agentspec_mw_vllm.serve import ServeConfig

_OPTIONS = [
    ({"cost_model": "measured"}, "cost_model"),
    ({"cost_model": "cpu-smollm2"}, "cost_model"),
    ({"proposer_options": {"index_max_tokens": 1024}}, "proposer_options"),
    ({"cost_model": "measured", "proposer_options": {"k": 1}}, "cost_model"),
]


@pytest.mark.parametrize("speculative", [None, "ngram", "suffix"])
@pytest.mark.parametrize(("options", "named"), _OPTIONS)
def test_proposer_options_without_a_proposer_are_refused(
    speculative: str | None, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=f"^{named} configures this project's proposers") as e:
        engine_kwargs("m", speculative=speculative, **options)
    assert f"speculative={speculative!r}" in str(e.value) and "'agentspec'" in str(e.value)
    # agentspec serve refuses the same combinations
    flag = "--" + named.replace("_", "-")
    with pytest.raises(ValueError, match=flag):
        ServeConfig(speculative=speculative, **options)


def test_the_engine_chat_model_refuses_them_at_construction() -> None:
    from agentspec_mw_langgraph import ChatAgentSpecVLLM

    for speculative in (None, "ngram", "suffix"):
        with pytest.raises(ValueError, match="cost_model configures this project's proposers"):
            ChatAgentSpecVLLM(speculative=speculative, engine_options={"cost_model": "measured"})
        with pytest.raises(ValueError, match="proposer_options configures"):
            ChatAgentSpecVLLM(
                speculative=speculative, engine_options={"proposer_options": {"k": 1}}
            )
    # with a proposer they are taken (the engine is built on first use: not here)
    model = ChatAgentSpecVLLM(engine_options={"cost_model": "measured", "max_num_seqs": 4})
    assert model.engine is None


def test_what_the_methods_still_take() -> None:
    """Without the options (or with empty ones) vLLM's methods and no speculation build as
    before; a proposer takes both."""
    for speculative in (None, "ngram", "suffix"):
        check_drafter_options(speculative)
        check_drafter_options(speculative, {}, None)  # empty options: nothing to drop
        kw = engine_kwargs("m", speculative=speculative, proposer_options={}, k=4)
        assert "additional_config" not in kw
        if speculative is not None:
            assert kw["speculative_config"] == {"method": speculative, "num_speculative_tokens": 4}
    kw = engine_kwargs(
        "m",
        speculative="agentspec",
        cost_model="measured",
        proposer_options={"index_max_tokens": 1024},
    )
    assert kw["additional_config"]["agentspec"] == {
        "proposer": "agentspec",
        "cost_model": "measured",
        "options": {"index_max_tokens": 1024},
    }
