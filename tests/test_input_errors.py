"""Bad inputs fail early, typed and named (file, line, value), or are skipped on request."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from agentspec_mw.cli import main
from agentspec_mw.errors import ModelNotFoundError, TraceFormatError
from agentspec_mw.replay.run import ReplayConfig
from agentspec_mw.traces import LoadStats, iter_records
from agentspec_mw.traces.tokenized import load_tokenizer, tokenize_trace


def _rec(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "workload": "w",
        "run_id": "r0",
        "call_index": 0,
        "agent": "a",
        "prompt": "hi",
        "output": "hello",
    }
    return {**base, **kw}


def _jsonl(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def replay_argv(
    trace: Path | list[Path], tokenizer: Path | str, tmp_path: Path, *opts: str
) -> list[str]:
    """``agentspec replay`` on ``trace`` (one or several) at batch 1, no progress bars,
    its token cache under ``tmp_path``."""
    traces = [trace] if isinstance(trace, Path) else trace
    return [
        "replay",
        "--traces",
        *map(str, traces),
        "--tokenizer",
        str(tokenizer),
        "--batch",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
        *opts,
    ]


def _replay(trace: Path, tokenizer: Path, tmp_path: Path, *opts: str) -> int:
    return main(replay_argv(trace, tokenizer, tmp_path, "--plot", str(tmp_path / "r.png"), *opts))


# --- .xz files with several streams (defect 3) ---------------------------------------


def test_a_corrupt_later_xz_stream_is_an_error_not_the_end(
    sample_path: Path, tmp_path: Path
) -> None:
    lines = sample_path.read_bytes().splitlines(keepends=True)
    second = bytearray(lzma.compress(b"".join(lines[6:])))
    second[8] ^= 0xFF  # the second stream's header
    path = tmp_path / "two.jsonl.xz"
    path.write_bytes(lzma.compress(b"".join(lines[:6])) + bytes(second))
    with pytest.raises(TraceFormatError) as err:
        list(iter_records(path, skip_malformed=True))
    assert err.value.path == str(path) and err.value.line == 7
    assert "unreadable" in str(err.value) and "corrupt" in str(err.value)


def test_every_xz_stream_is_read_across_zero_padding(sample_path: Path, tmp_path: Path) -> None:
    lines = sample_path.read_bytes().splitlines(keepends=True)
    path = tmp_path / "padded.jsonl.xz"
    path.write_bytes(
        lzma.compress(b"".join(lines[:6]))
        + b"\0" * 8  # stream padding, as xz allows between streams
        + lzma.compress(b"".join(lines[6:]))
        + b"\0" * 4
    )
    assert len(list(iter_records(path))) == len(lines)
    garbage = tmp_path / "garbage.jsonl.xz"
    garbage.write_bytes(lzma.compress(b"".join(lines)) + b"not xz")
    with pytest.raises(TraceFormatError, match="unreadable"):
        list(iter_records(garbage))


# --- the token cache keeps the loader's counts (defect 4) -----------------------------


def test_a_cache_hit_reports_the_skipped_records_again(
    sample_path: Path,
    tiny_tokenizer: Any,
    tmp_path: Path,
) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(sample_path.read_text() + '{"bad": 1}\n')
    first, second = LoadStats(), LoadStats()
    kw: dict[str, Any] = {"cache_dir": tmp_path / "c", "skip_malformed": True, "progress": False}
    a = tokenize_trace(path, tiny_tokenizer, stats=first, **kw)
    b = tokenize_trace(path, tiny_tokenizer, stats=second, **kw)
    assert b.folder == a.folder  # a cache hit
    assert (second.records, second.skipped) == (first.records, first.skipped) == (18, 1)
    assert second.errors == first.errors and second.errors[0].startswith(f"{path}:19: ")
    moved = tmp_path / "moved.jsonl"  # the same content under another name: its own path
    moved.write_bytes(path.read_bytes())
    third = LoadStats()
    tokenize_trace(moved, tiny_tokenizer, stats=third, **kw)
    assert third.skipped == 1 and third.errors[0].startswith(f"{moved}:19: ")
    (a.folder / "load.json").unlink()  # an entry without the counts: read again, kept
    fourth = LoadStats()
    tokenize_trace(path, tiny_tokenizer, stats=fourth, **kw)
    assert (fourth.records, fourth.skipped, fourth.errors) == (18, 1, first.errors)
    assert (a.folder / "load.json").is_file()


def test_a_cache_hit_via_the_cli_warns_about_skipped_records(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_text(sample_path.read_text() + '{"bad": 1}\n')
    for i in (1, 2):
        out = tmp_path / f"m{i}.json"
        opts = ("--skip-malformed", "--proposers", "none", "--json", str(out))
        assert _replay(path, tiny_tokenizer_dir, tmp_path, *opts) == 0
        assert f"warning: {path}: skipped 1 malformed records" in capsys.readouterr().err
        load = json.loads(out.read_text())["load"][str(path)]
        assert (load["records"], load["skipped"]) == (18, 1)


# --- the schema catches what would fail later (defects 5, 6, 13b) ---------------------


@pytest.mark.parametrize(
    "tool_calls",
    [[5], [{"function": "search"}], "search()", [{"function": {"name": 3}}]],
)
def test_malformed_tool_calls_are_a_format_error(tmp_path: Path, tool_calls: Any) -> None:
    prompt = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
    ]
    good = {"function": {"name": "f", "arguments": "{}"}}
    ok = [{"role": "assistant", "content": None, "tool_calls": [good, {"name": "g"}]}]
    path = _jsonl(tmp_path / "t.jsonl", _rec(prompt=ok), _rec(call_index=1, prompt=prompt))
    with pytest.raises(TraceFormatError, match="tool_calls") as err:
        list(iter_records(path))
    assert err.value.line == 2 and err.value.path == str(path)
    stats = LoadStats()
    assert len(list(iter_records(path, skip_malformed=True, stats=stats))) == 1
    assert stats.skipped == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"output": "bad \ud800 text"},
        {"prompt": "bad \udfff"},
        {"prompt": [{"role": "user", "content": [{"type": "text", "text": "x\ud800"}]}]},
        {"parent_group": "g\ud800"},
        {"prompt": [{"role": "user", "content": "x", "name": "n\udc00"}]},
    ],
)
def test_a_lone_surrogate_is_a_format_error(tmp_path: Path, bad: dict[str, Any]) -> None:
    emoji = "\U0001f600"  # a surrogate pair in JSON: valid
    path = _jsonl(tmp_path / "s.jsonl", _rec(output=emoji), _rec(call_index=1, **bad))
    assert "\\ud83d\\ude00" in path.read_text()
    with pytest.raises(TraceFormatError, match="lone surrogate") as err:
        list(iter_records(path))
    assert err.value.line == 2
    recs = list(iter_records(path, skip_malformed=True))
    assert [r.output for r in recs] == [emoji]


@pytest.mark.parametrize("field", ["run_id", "agent", "parent_group"])
def test_ids_longer_than_the_tags_take_are_a_format_error(tmp_path: Path, field: str) -> None:
    path = _jsonl(tmp_path / "l.jsonl", _rec(**{field: "x" * 256}), _rec(**{field: "y" * 257}))
    with pytest.raises(TraceFormatError, match=f"field {field}: .*257 characters") as err:
        list(iter_records(path))
    assert err.value.line == 2
    assert len(list(iter_records(path, skip_malformed=True))) == 1


def test_a_long_run_id_fails_in_the_cli_naming_file_and_line(
    tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _jsonl(tmp_path / "long.jsonl", _rec(run_id="r" * 300))
    assert _replay(path, tiny_tokenizer_dir, tmp_path, "--proposers", "none") == 2
    assert f"error: {path}:1: malformed trace record: field run_id" in capsys.readouterr().err


# --- repeated calls in one file (defect 10) -------------------------------------------


def test_a_call_repeated_in_one_file_is_a_format_error(sample_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "doubled.jsonl"
    path.write_text(sample_path.read_text() * 2)
    with pytest.raises(TraceFormatError, match=r"call_index 0 twice \(also on line 1\)") as err:
        list(iter_records(path))
    assert err.value.line == 19 and "tool-run0" in str(err.value)
    stats = LoadStats()
    assert len(list(iter_records(path, skip_malformed=True, stats=stats))) == 18
    assert stats.skipped == 18
    # the same call in another workload, or another call of the run, is no repeat
    other = _jsonl(tmp_path / "o.jsonl", _rec(), _rec(workload="v"), _rec(call_index=1))
    assert len(list(iter_records(other))) == 3


# --- the tokenizer (defect 7) ----------------------------------------------------------


def test_a_tokenizer_that_cannot_be_loaded_is_a_model_not_found_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ModelNotFoundError, match="tokenizer .* cannot be loaded.*`default`"):
        load_tokenizer(str(tmp_path))  # a folder without a tokenizer
    from transformers import AutoTokenizer

    def offline(*a: object, **k: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", offline)
    with pytest.raises(ModelNotFoundError, match="'Qwen/NoSuchTokenizer' cannot be loaded"):
        load_tokenizer("Qwen/NoSuchTokenizer")


def test_the_cli_reports_an_unknown_tokenizer_cleanly(
    sample_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _replay(sample_path, tmp_path, tmp_path, "--proposers", "none") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentspec replay: error: tokenizer {str(tmp_path)!r} cannot be loaded")


# --- proposer options (defect 8) -------------------------------------------------------


def test_options_for_a_proposer_not_replayed_are_rejected(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="'ngarm', not among the proposers replayed"):
        ReplayConfig(traces=["t"], tokenizer="t", proposer_options={"ngarm": {"x": 1}})
    opts = ("--proposers", "none,ngram", "--set", "ngarm.prompt_lookup_min=1")
    assert _replay(sample_path, tiny_tokenizer_dir, tmp_path, *opts) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentspec replay: error: proposer_options (--set) name 'ngarm'")
    assert "--proposers" in err and "input_value" not in err
    assert _replay(sample_path, tiny_tokenizer_dir, tmp_path, "--set", "ngram") == 2
    assert "error: --set 'ngram': expected PROPOSER.OPTION=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["ngram.prompt_lookup_min=0", "ngram.nosuch=1", "none.x=1"])
def test_bad_proposer_options_fail_before_tokenizing(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    option: str,
) -> None:
    import agentspec_mw.traces.tokenized as tokenized

    def no_tokenizing(*a: object, **k: object) -> None:
        raise AssertionError("tokenized before the options were checked")

    monkeypatch.setattr(tokenized, "tokenize_trace", no_tokenizing)
    opts = ("--proposers", "none,ngram", "--set", option)
    assert _replay(sample_path, tiny_tokenizer_dir, tmp_path, *opts) == 2
    name, _, rest = option.partition(".")
    err = capsys.readouterr().err
    assert f"error: proposer {name!r}: bad options" in err and rest.partition("=")[0] in err


# --- nothing to replay (defect 9) -------------------------------------------------------


def test_traces_without_calls_are_an_error_not_nan(
    tiny_tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _replay(empty, tiny_tokenizer_dir, tmp_path, "--proposers", "none") == 2
    err = capsys.readouterr().err
    assert f"error: no calls to replay in {empty}: the traces hold no (valid) records" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"bad": 1}\n')
    opts = ("--proposers", "none", "--skip-malformed")
    assert _replay(bad, tiny_tokenizer_dir, tmp_path, *opts) == 2
    assert "(1 malformed record(s) skipped)" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()
