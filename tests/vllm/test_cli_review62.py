"""``agentspec serve`` / ``cluster`` review (session 62): a path that cannot be made, a port
range past 65535 and a bad option are one line and exit 2; ``AGENTSPEC_PRELOAD`` takes
the usual false spellings and refuses others. No server or router starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agentspec_mw.cli import main
from agentspec_mw_vllm import preload
from agentspec_mw_vllm.cluster import ClusterConfig
from tests.serving import free_port
from tests.test_bench import fake_cpu_prefix
from tests.test_cli_review62 import _one_line


def test_cluster_log_dir_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    argv = ["cluster", "--log-dir", str(afile), "--port", str(free_port())]
    assert main(argv) == 2
    assert f"error: '{afile}': File exists" in _one_line(capsys, "cluster")


def test_cluster_ports_past_65535_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ClusterConfig(port=65533, replicas=2).replica_ports() == [65534, 65535]
    with pytest.raises(ValidationError, match="past 65535; choose a --port of at most 65533"):
        ClusterConfig(port=65535, replicas=2)
    argv = ["cluster", "--port", "65535", "--replicas", "2", "--log-dir", str(tmp_path / "l")]
    assert main(argv) == 2
    assert "ports 65536..65537, past 65535" in _one_line(capsys, "cluster")


def test_serve_dry_run_with_agentspec_cache_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("AGENTSPEC_CACHE", str(afile))
    assert main(["serve", "--dry-run"]) == 2
    assert f"'{afile}/models': Not a directory" in _one_line(capsys, "serve")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["serve", "--k", "0", "--dry-run"], "k: Input should be greater than or equal to 1"),
        (["cluster", "--replicas", "0"], "replicas: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_serve_or_cluster_option_is_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert _one_line(capsys, argv[0]) == f"agentspec {argv[0]}: error: {line}"


def test_agentspec_preload_takes_the_usual_spellings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = str(fake_cpu_prefix(tmp_path, monkeypatch))
    for off in ("0", "false", "no", "off", "OFF", " False "):
        assert preload.preload_env({"AGENTSPEC_PRELOAD": off}, prefix=prefix) == "", off
    for on in ("1", "true", "yes", "on", "On", ""):
        value = preload.preload_env({"AGENTSPEC_PRELOAD": on}, prefix=prefix)
        assert value.endswith("libiomp5.so"), on
    with pytest.raises(ValueError, match=r"AGENTSPEC_PRELOAD='maybe': expected 0, false, no"):
        preload.preload_env({"AGENTSPEC_PRELOAD": "maybe"}, prefix=prefix)
