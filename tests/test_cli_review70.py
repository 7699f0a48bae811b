"""Review 70: the replay CLI never overwrites a trace with its report; bad traces,
tokenizers and sizes are one-line errors; tags the server would refuse are refused where
they are built; ``--set`` reaches a proposer given as a dotted path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentspec_mw.agentspec.config import AgentSpecConfig
from agentspec_mw.cli import _parse_set, main
from agentspec_mw.errors import ModelNotFoundError, TraceFormatError
from agentspec_mw.tags import StructureTags
from agentspec_mw.traces import LoadStats, iter_records
from agentspec_mw.traces.tokenized import load_tokenizer

from .test_cli_review62 import _one_line
from .test_input_errors import _jsonl, _rec, replay_argv


def test_the_json_report_never_overwrites_a_trace(
    tmp_path: Path, tiny_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _jsonl(tmp_path / "t.jsonl", _rec())
    before = trace.read_text()
    argv = replay_argv(trace, tiny_tokenizer_dir, tmp_path, "--proposers", "none")
    assert main([*argv, "--json", str(trace)]) == 2
    assert "is one of the --traces" in _one_line(capsys)
    assert trace.read_text() == before


def test_replicas_over_the_batch_fail_before_tokenizing(
    tmp_path: Path, tiny_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _jsonl(tmp_path / "t.jsonl", _rec())
    argv = replay_argv(trace, tiny_tokenizer_dir, tmp_path, "--proposers", "none,ngram")
    assert main([*argv, "--replicas", "4"]) == 2
    assert "batch 1 is smaller than 4 replicas" in _one_line(capsys)
    assert not (tmp_path / "cache").exists()  # nothing tokenized


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"meta": ' + "[" * 200_000 + "]" * 200_000 + "}\n", "nested too deep"),
        ('{"call_index": ' + "9" * 5000 + "}\n", "invalid JSON: Exceeds the limit"),
    ],
)
def test_json_python_cannot_read_is_a_named_malformed_record(
    tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(content + json.dumps(_rec()) + "\n")
    with pytest.raises(TraceFormatError, match=reason) as caught:
        list(iter_records(path))
    assert caught.value.line == 1
    stats = LoadStats()
    assert len(list(iter_records(path, skip_malformed=True, stats=stats))) == 1


def test_a_corrupt_gzip_trace_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    data = bytearray(gzip.compress((json.dumps(_rec()) + "\n").encode() * 50))
    data[20:40] = b"\xff" * 20
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="truncated or corrupt"):
        list(iter_records(path))


def test_a_tokenizer_json_the_library_cannot_read_is_a_named_error(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    bad = tmp_path / "badtok"
    bad.mkdir()
    for f in tiny_tokenizer_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    spec = json.loads((bad / "tokenizer.json").read_text())
    spec["model"]["type"] = "NoSuchModel"
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelNotFoundError, match="cannot be loaded"):
        load_tokenizer(str(bad))


def test_tags_the_server_would_refuse_are_refused_where_built() -> None:
    quotes = tuple(('"' * 62 + f"{i:02d}", '"' * 60) for i in range(32))  # JSON-escaped x2
    with pytest.raises(ValidationError, match="characters on the wire, over 8192"):
        StructureTags(agent_id="a", query_id="q", blocks=quotes)
    StructureTags(agent_id="a", query_id="q", blocks=quotes[:8])


def test_set_reaches_a_proposer_given_as_a_dotted_path() -> None:
    path = "agentspec_mw.peers.suffix.SuffixProposer"
    got = _parse_set([f"{path}.min_token_prob=0.2", "ngram.n=3"], ["none", path, "ngram"])
    assert got == {path: {"min_token_prob": 0.2}, "ngram": {"n": 3}}


def test_config_bounds_and_reserved_names(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="less than or equal"):
        AgentSpecConfig(index_max_tokens=10**26)
    with pytest.raises(ValidationError, match="is not a preset"):
        AgentSpecConfig(budget_cost_model="nope")
    path = _jsonl(tmp_path / "t.jsonl", _rec(workload="ALL"))
    with pytest.raises(TraceFormatError, match="pooled rows"):
        list(iter_records(path))
