"""``agentspec serve`` argument handling (no server started)."""

from __future__ import annotations

import json

import pytest

from agentspec_mw.cli import build_parser
from agentspec_mw_vllm.cli import serve_config_from_args
from agentspec_mw_vllm.engine import ADAPTER_PATH
from agentspec_mw_vllm.serve import server_command, server_env


def _cfg(*argv: str):  # type: ignore[no-untyped-def]
    return serve_config_from_args(build_parser().parse_args(["serve", *argv]))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_serve_defaults_bind_loopback_and_configure_the_adapter() -> None:
    argv = server_command(_cfg("--model", "org/model", "--k", "5"))
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--host") == "127.0.0.1" and _flag(argv, "--model") == "org/model"
    spec = json.loads(_flag(argv, "--speculative-config"))
    assert spec == {"num_speculative_tokens": 5, "method": "custom_class", "model": ADAPTER_PATH}
    extra = json.loads(_flag(argv, "--additional-config"))
    assert extra == {"agentspec": {"proposer": "agentspec"}}  # the server's env applies
    assert "--served-model-name" not in argv


def test_serve_passes_vllm_methods_options_and_extra_args() -> None:
    argv = server_command(
        _cfg("--model", "m", "--speculative", "suffix", "--host", "0.0.0.0", "--", "--seed", "3")
    )
    assert json.loads(_flag(argv, "--speculative-config"))["method"] == "suffix"
    assert "--additional-config" not in argv and argv[-2:] == ["--seed", "3"]
    assert _flag(argv, "--host") == "0.0.0.0"
    argv = server_command(_cfg("--model", "m", "--speculative", "none"))
    assert "--speculative-config" not in argv
    argv = server_command(
        _cfg("--model", "m", "--speculative", "ngram", "--proposer-options", "{}")
    )
    assert json.loads(_flag(argv, "--speculative-config"))["method"] == "ngram"
    argv = server_command(
        _cfg(
            "--model",
            "m",
            "--speculative",
            "tests.vllm.fakes.ProbeProposer",
            "--proposer-options",
            '{"draft_len": 2}',
        )
    )
    assert json.loads(_flag(argv, "--additional-config"))["agentspec"]["options"] == {
        "draft_len": 2
    }


def test_serve_asks_for_per_request_spec_decode_metrics_when_speculating() -> None:
    """Each response then carries ``metrics.speculative_decoding`` (vLLM refuses the
    option without speculation); the user's own value after ``--`` comes later and wins."""
    flag = "--per-request-spec-decode-metrics"
    for method in ("agentspec", "suffix", "ngram"):
        argv = server_command(_cfg("--model", "m", "--speculative", method))
        assert _flag(argv, flag) == "summary", method
    assert flag not in server_command(_cfg("--model", "m", "--speculative", "none"))
    argv = server_command(_cfg("--model", "m", "--", flag, "detailed"))
    assert argv[-2:] == [flag, "detailed"] and argv.count(flag) == 2


def test_serve_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="proposer-options"):
        _cfg("--proposer-options", "{")
    with pytest.raises(Exception, match="no.such"):
        server_command(_cfg("--model", "m", "--speculative", "no.such.Class"))


def test_server_env_sets_cpu_defaults_without_overriding() -> None:
    env = server_env({"OMP_NUM_THREADS": "4"})
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["NUMBA_NUM_THREADS"] == "4"  # numba's count follows OpenMP's


def test_thread_limits_only_on_the_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA build the CPU has cores to spare: no thread limits are added."""
    import agentspec_mw_vllm.engine as engine

    monkeypatch.setattr(engine, "is_cpu_build", lambda: False)
    env = server_env({})
    assert "NUMBA_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    monkeypatch.setattr(engine, "is_cpu_build", lambda: True)
    env = server_env({})
    # numba's threads = OpenMP's: with the preloaded Intel OpenMP they share one runtime,
    # and vLLM's n-gram proposer resets the engine thread's team to numba's count
    assert env["NUMBA_NUM_THREADS"] == env["OMP_NUM_THREADS"]
    # one OpenMP thread per CPU this process may use (not 1: two threads decode 1.4-1.65x
    # faster than one on a 2-core host, outputs identical; docs/deployment.md)
    assert env["OMP_NUM_THREADS"] == str(engine.usable_cpus())


def test_usable_cpus_follows_the_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import agentspec_mw_vllm.engine as engine

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 3, 5}, raising=False)
    assert engine.usable_cpus() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert engine.usable_cpus() == 1
