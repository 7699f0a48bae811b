"""``agentspec replay`` review (session 62): bad output paths fail before the replay; an
``OSError`` or a bad option is one line and exit 2; ``k`` and the SuffixDecoding options
are bounded; a call given in two files is refused; a workload without output tokens is
refused up front; ``--replicas`` shows progress; a plot name gets the extension matplotlib
writes. No engine: the tiny tokenizer and the sample trace."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

import agentspec_mw.traces.tokenized as tokenized
from agentspec_mw.cli import main

from .test_input_errors import replay_argv

_argv = replay_argv


@pytest.fixture
def no_tokenizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokenizing fails the test: what must be refused is refused before it."""

    def fail(*a: object, **k: object) -> None:
        raise AssertionError("tokenized before the bad input was refused")

    monkeypatch.setattr(tokenized, "tokenize_trace", fail)


def _one_line(capsys: pytest.CaptureFixture[str], command: str = "replay") -> str:
    """The single stderr line of a refused command (no traceback, no pydantic dump)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"agentspec {command}: error: "), err
    assert "errors.pydantic.dev" not in err and "input_value" not in err
    return lines[0]


# --- 1: output paths are checked before the replay -----------------------------------------


@pytest.mark.parametrize("replicas", [(), ("--replicas", "2", "--batch", "2")])
def test_bad_output_paths_fail_before_tokenizing(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
    replicas: tuple[str, ...],
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "isdir.json").mkdir()
    ok_json = tmp_path / "ok.json"
    cases = [
        (("--json", str(afile / "r.json")), "afile/r.json"),  # its folder is a file
        (("--json", str(tmp_path / "isdir.json")), "isdir.json"),  # a folder
        (("--plot", str(afile / "p.png"), "--json", str(ok_json)), "afile/p.png"),
        (("--json", str(afile / "r.json"), "--plot", str(tmp_path / "p.png")), "afile/r.json"),
    ]
    for opts, named in cases:
        argv = _argv(sample_path, tiny_tokenizer_dir, tmp_path, "--proposers", "none,ngram")
        assert main([*argv, *replicas, *opts]) == 2
        line = _one_line(capsys)
        assert "cannot write" in line and named in line, line
    assert not ok_json.exists()  # the check leaves nothing behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_json_path_fails_before_tokenizing(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        argv = _argv(sample_path, tiny_tokenizer_dir, tmp_path, "--json", str(locked / "r.json"))
        assert main(argv) == 2
        assert "cannot write" in _one_line(capsys)
    finally:
        locked.chmod(0o700)


def test_the_plot_may_not_overwrite_the_json(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    same = str(tmp_path / "r.png")
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, "--json", same)) == 2
    assert "is the --json file too" in _one_line(capsys)


# --- 2: OSErrors and unbounded inputs: one line, exit 2 --------------------------------------


def test_a_cache_dir_that_is_a_file_is_one_line(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opts = ("--proposers", "none", "--plot", str(tmp_path / "p.png"))
    argv = _argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)
    argv[argv.index("--cache-dir") + 1] = str(sample_path)  # a file
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"'{sample_path}/tokens': Not a directory" in line


def test_agentspec_cache_a_file_is_one_line(
    sample_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("AGENTSPEC_CACHE", str(afile))
    argv = ["replay", "--traces", str(sample_path), "--tokenizer", "default", "--no-progress"]
    assert main([*argv, "--plot", str(tmp_path / "p.png")]) == 2
    assert f"'{afile}/models': Not a directory" in _one_line(capsys)


def test_k_is_bounded(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    from agentspec_mw.replay.run import ReplayConfig

    assert ReplayConfig(traces=["t"], tokenizer="t", k=[1024]).k == [1024]
    with pytest.raises(ValidationError, match="values must be <= 1024"):
        ReplayConfig(traces=["t"], tokenizer="t", k=[8, 1025])
    opts = ("--proposers", "agentspec", "--k", "100000000")
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    assert "error: k: values must be <= 1024" in _one_line(capsys)


def test_no_proposers_is_refused(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, "--proposers", "")) == 2
    assert "error: proposers: List should have at least 1 item" in _one_line(capsys)


# --- 4: SuffixDecoding's numbers are finite and bounded -------------------------------------


@pytest.mark.parametrize("value", ["2.2e9", "Infinity", "1e300"])
def test_a_huge_suffix_spec_factor_is_refused(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
    value: str,
) -> None:
    """arctic-inference's draft cap (factor × match length) is a 32-bit int: past 2^31
    it overflowed and SuffixDecoding silently drafted nothing."""
    opts = ("--proposers", "none,suffix", "--set", f"suffix.max_spec_factor={value}")
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    line = _one_line(capsys)
    assert "proposer 'suffix': bad options" in line
    assert "max_spec_factor: Input should be less than or equal to 1024" in line


def test_the_suffix_bounds() -> None:
    from agentspec_mw.peers.suffix import SuffixConfig

    for bad in (
        {"max_spec_factor": float("inf")},
        {"max_spec_factor": float("nan")},
        {"max_tree_depth": (1 << 16) + 1},
        {"max_cached_requests": 1 << 31},
    ):
        with pytest.raises(ValidationError):
            SuffixConfig(**bad)
    SuffixConfig(max_spec_factor=1024, max_tree_depth=1 << 16, max_cached_requests=(1 << 31) - 1)


@pytest.mark.peers
def test_the_largest_suffix_spec_factor_still_drafts() -> None:
    from agentspec_mw.proposer import StepContext
    from agentspec_mw.registry import make_proposer

    prop = make_proposer("suffix", max_spec_factor=1024, max_tree_depth=1 << 16)
    prop.start("a", np.array([1, 2, 3, 4, 5, 6] * 2 + [1, 2, 3], dtype=np.int32))
    (draft,) = prop.propose(["a"], 8, StepContext(batch_size=1))
    assert draft.token_ids[:3] == (4, 5, 6)


# --- 5: the same calls in two files ---------------------------------------------------------


def test_the_same_trace_given_twice_is_refused(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy.jsonl"
    shutil.copy(sample_path, copy)
    plot = ("--proposers", "none", "--plot", str(tmp_path / "p.png"))
    for second in (sample_path, copy):  # the file twice, or an identical copy
        assert main(_argv([sample_path, second], tiny_tokenizer_dir, tmp_path, *plot)) == 2
        line = _one_line(capsys)
        assert f"in '{sample_path}' and in '{second}'" in line and "given twice" in line
    assert not (tmp_path / "p.png").exists()


def test_build_calls_refuses_a_call_in_two_files(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from agentspec_mw.replay.run import build_calls
    from tests.conftest import SAMPLE

    tr = tokenized.tokenize_trace(SAMPLE, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match=r"has call_index 0 in 'a\.jsonl' and in 'b\.jsonl'"):
        build_calls([tr, tr], sources=["a.jsonl", "b.jsonl"])


# --- 7: --replicas shows progress -----------------------------------------------------------


def test_replicas_show_progress_unless_told_not_to(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _argv(sample_path, tiny_tokenizer_dir, tmp_path, "--proposers", "none,ngram")
    argv.remove("--no-progress")
    argv += ["--replicas", "2", "--routing", "affinity", "--plot", str(tmp_path / "r.png")]
    argv[argv.index("--batch") + 1] = "2"  # at least one run per replica
    assert main(argv) == 0
    assert "replay: 100%" in capsys.readouterr().err
    assert main([*argv, "--no-progress"]) == 0
    assert "replay:" not in capsys.readouterr().err


def test_replicas_with_no_proposer_but_none_is_refused(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    """``--replicas`` reports each proposer's speedup over none: with none alone it had
    nothing to report (an empty table, a plot with no lines)."""
    argv = _argv(sample_path, tiny_tokenizer_dir, tmp_path, "--proposers", "none")
    assert main([*argv, "--replicas", "2", "--batch", "2"]) == 2
    assert "give a proposer besides none" in _one_line(capsys)


# --- 8: a workload without output tokens ----------------------------------------------------


@pytest.mark.parametrize("replicas", [(), ("--replicas", "2", "--batch", "2")])
def test_a_workload_without_output_tokens_is_refused_up_front(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    replicas: tuple[str, ...],
) -> None:
    empty = {
        "workload": "empties",
        "run_id": "r0",
        "call_index": 0,
        "agent": "a",
        "prompt": "hi",
        "output": "",
    }
    trace = tmp_path / "mixed.jsonl"
    trace.write_text(sample_path.read_text() + json.dumps(empty) + "\n")
    out = tmp_path / "r.json"
    opts = ("--proposers", "none,suffix", "--json", str(out), *replicas)
    assert main(_argv(trace, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    line = _one_line(capsys)
    assert "workload(s) 'empties' (1 call(s)) have no output tokens to replay" in line
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_run_replay_refuses_a_workload_without_output_tokens() -> None:
    from agentspec_mw.replay.replicas import run_replica_replay
    from agentspec_mw.replay.run import ReplayConfig, run_replay
    from agentspec_mw.replay.sim import ReplayCall

    call = ReplayCall("0", "r0", np.arange(8, dtype=np.int32), np.zeros(0, dtype=np.int32))
    cfg = ReplayConfig(traces=["t"], tokenizer="t", proposers=["none"], batch=[1])
    with pytest.raises(ValueError, match="'w' .* have no output tokens"):
        run_replay(cfg, {"w": [call]}, progress=False)
    with pytest.raises(ValueError, match="'w' .* have no output tokens"):
        run_replica_replay(cfg, {"w": [call]}, [2])


# --- 9: option errors are one line ----------------------------------------------------------


def test_validation_message_is_one_line() -> None:
    from agentspec_mw.cli import validation_message
    from agentspec_mw.replay.run import ReplayConfig

    with pytest.raises(ValidationError) as info:
        ReplayConfig(traces=[], tokenizer="t", batch=[0], bogus=1)  # type: ignore[call-arg]
    text = validation_message(info.value)
    assert "\n" not in text and "pydantic.dev" not in text
    assert text.startswith("traces: List should have at least 1 item")
    assert "; batch: values must be >= 1, got [0]; bogus: Extra inputs" in text


def test_a_bad_set_option_is_one_line(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    opts = ("--proposers", "suffix", "--set", "suffix.max_spec_factor=-1")
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    assert _one_line(capsys).endswith(
        "bad options {'max_spec_factor': -1}: max_spec_factor: Input should be greater than 0"
    )


# --- 10: plot names -------------------------------------------------------------------------


def test_a_plot_name_without_an_extension_gets_png(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "myplot"
    opts = ("--proposers", "none", "--plot", str(plot))
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 0
    assert f"wrote {plot}.png" in capsys.readouterr().out.splitlines()
    assert (tmp_path / "myplot.png").is_file() and not plot.exists()


def test_a_plot_path_that_is_a_folder_is_refused(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tokenizing: None,
) -> None:
    folder = tmp_path / "plots"
    folder.mkdir()
    opts = ("--proposers", "none", "--plot", str(folder))
    assert main(_argv(sample_path, tiny_tokenizer_dir, tmp_path, *opts)) == 2
    assert f"plot path '{folder}' is a folder" in _one_line(capsys)
    assert not (tmp_path / "plots.png").exists()


def test_plot_path() -> None:
    from agentspec_mw.replay.report import plot_path

    assert plot_path("a/myplot") == Path("a/myplot.png")
    assert plot_path("run.v2") == Path("run.v2.png")
    assert plot_path("x.svg") == Path("x.svg") and plot_path("x.PNG") == Path("x.PNG")


def test_the_ngram_lookup_bounds() -> None:
    """vLLM's n-gram kernel allocates an array of ``prompt_lookup_max`` entries a call: a
    huge value is refused when the options are read, not mid-replay."""
    import pydantic
    import pytest as _pytest

    from agentspec_mw.peers.ngram import NgramConfig

    assert NgramConfig(prompt_lookup_min=1, prompt_lookup_max=1024).prompt_lookup_max == 1024
    for field in ("prompt_lookup_min", "prompt_lookup_max"):
        with _pytest.raises(pydantic.ValidationError):
            NgramConfig(**{field: 10**9})
