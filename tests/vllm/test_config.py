"""DrafterConfig sources and the engine factory's argument routing (no engine started)."""

from __future__ import annotations

import pytest

from agentspec_mw.errors import ProposerLoadError
from agentspec_mw_vllm.config import DrafterConfig
from agentspec_mw_vllm.engine import ADAPTER_PATH, engine_kwargs


def test_additional_config_wins_over_environment() -> None:
    env = {
        "AGENTSPEC_PROPOSER": "ngram",
        "AGENTSPEC_PROPOSER_OPTIONS": '{"prompt_lookup_min": 2}',
        "AGENTSPEC_COST_MODEL": "llama8b-h200",
    }
    cfg = DrafterConfig.from_sources({}, env)
    assert (cfg.proposer, cfg.options, cfg.cost_model) == (
        "ngram",
        {"prompt_lookup_min": 2},
        "llama8b-h200",
    )
    cfg = DrafterConfig.from_sources({"agentspec": {"proposer": "suffix"}}, env)
    assert cfg.proposer == "suffix" and cfg.cost_model == "llama8b-h200"
    assert DrafterConfig.from_sources(None, {}).proposer == "agentspec"


def test_bad_config_is_reported() -> None:
    with pytest.raises(ValueError, match="cost_model='x' is neither 'measured' nor a preset"):
        DrafterConfig(cost_model="x")
    assert DrafterConfig(cost_model="measured").cost_model == "measured"
    with pytest.raises(ValueError, match="AGENTSPEC_PROPOSER_OPTIONS"):
        DrafterConfig.from_sources({}, {"AGENTSPEC_PROPOSER_OPTIONS": "{"})
    with pytest.raises(ValueError, match="must be a dict"):
        DrafterConfig.from_sources({"agentspec": "ngram"}, {})


def test_engine_kwargs_route_methods() -> None:
    assert "speculative_config" not in engine_kwargs("m", speculative=None)
    for method in ("ngram", "suffix"):
        kw = engine_kwargs("m", speculative=method, k=4)
        assert kw["speculative_config"] == {"method": method, "num_speculative_tokens": 4}
        assert "additional_config" not in kw
    kw = engine_kwargs(
        "m",
        speculative="tests.vllm.fakes.ProbeProposer",
        k=3,
        proposer_options={"draft_len": 2},
        additional_config={"other": 1},
        enforce_eager=True,
    )
    assert kw["speculative_config"] == {
        "method": "custom_class",
        "model": ADAPTER_PATH,
        "num_speculative_tokens": 3,
    }
    assert kw["additional_config"]["other"] == 1
    assert kw["additional_config"]["agentspec"]["options"] == {"draft_len": 2}
    assert kw["enforce_eager"] is True and kw["model"] == "m"


def test_the_environment_applies_to_what_the_engine_factory_leaves_unset() -> None:
    """``build_llm``'s section names only what its caller chose, so the adapter in the
    engine still reads ``AGENTSPEC_COST_MODEL`` / ``AGENTSPEC_PROPOSER_OPTIONS`` (a
    section holding every default silently overrode them)."""
    env = {"AGENTSPEC_COST_MODEL": "cpu-smollm2", "AGENTSPEC_PROPOSER_OPTIONS": '{"k": 1}'}
    section = engine_kwargs("m", speculative="agentspec")["additional_config"]
    assert section == {"agentspec": {"proposer": "agentspec"}}
    cfg = DrafterConfig.from_sources(section, env)
    assert (cfg.proposer, cfg.cost_model, cfg.options) == ("agentspec", "cpu-smollm2", {"k": 1})
    opts = {"index_max_tokens": 1024}  # an option AgentSpec takes: engine_kwargs builds it
    chosen = engine_kwargs("m", cost_model="llama8b-h100", proposer_options=opts)
    cfg = DrafterConfig.from_sources(chosen["additional_config"], env)
    assert (cfg.cost_model, cfg.options) == ("llama8b-h100", opts)
    with pytest.raises(ValueError, match="cost_model='x'"):
        engine_kwargs("m", cost_model="x")


def test_engine_kwargs_fail_early() -> None:
    with pytest.raises(ProposerLoadError):
        engine_kwargs("m", speculative="no.such.Proposer")
    with pytest.raises(ProposerLoadError, match="no_such_option"):  # not in the engine core
        engine_kwargs("m", proposer_options={"no_such_option": 1})
    with pytest.raises(ValueError, match="k=0"):
        engine_kwargs("m", k=0)
    with pytest.raises(ValueError, match="max_model_len"):
        engine_kwargs("m", k=8, max_model_len=16)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu-build", "cuda-build"])
def test_engine_defaults_are_lossless_and_eager_on_cpu(
    cpu: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentspec_mw_vllm.engine as engine_mod
    from agentspec_mw_vllm.serve import ServeConfig, server_command

    monkeypatch.setattr(engine_mod, "is_cpu_build", lambda: cpu)
    kw = engine_kwargs("m")
    assert kw["dtype"] == ("float32" if cpu else "auto")
    assert kw.get("enforce_eager") is (True if cpu else None)
    assert kw["per_request_spec_decode_metrics"] == "summary"  # per-call stats
    assert "per_request_spec_decode_metrics" not in engine_kwargs("m", speculative=None)
    overridden = engine_kwargs("m", dtype="bfloat16", enforce_eager=False)
    assert overridden["dtype"] == "bfloat16" and overridden["enforce_eager"] is False

    argv = server_command(ServeConfig(model="org/model"))
    assert argv[argv.index("--dtype") + 1] == ("float32" if cpu else "auto")
    argv = server_command(ServeConfig(model="org/model", extra_args=["--dtype", "bfloat16"]))
    assert argv[len(argv) - 1 - argv[::-1].index("--dtype") + 1] == "bfloat16"  # last wins
    assert ("--enforce-eager" in server_command(ServeConfig(model="org/model"))) is cpu
    argv = server_command(ServeConfig(model="org/model", extra_args=["--no-enforce-eager"]))
    assert argv[-1] == "--no-enforce-eager"  # after ours: argparse's last flag wins


def test_measured_cost_model_is_the_default_with_a_platform_prior(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentspec_mw_vllm import adapter, engine

    cfg = DrafterConfig()
    assert cfg.cost_model == "measured" and cfg.cost_prior is None
    monkeypatch.setattr(engine, "is_cpu_build", lambda: True)
    assert adapter._prior(cfg) == "cpu-smollm2"
    monkeypatch.setattr(engine, "is_cpu_build", lambda: False)
    assert adapter._prior(cfg) == "llama8b-h100"
    assert adapter._prior(DrafterConfig(cost_prior="llama8b-h200")) == "llama8b-h200"
    with pytest.raises(ValueError, match="cost_prior='gpu' is not a preset"):
        DrafterConfig(cost_prior="gpu")
