#!/usr/bin/env bash
# The README's main-job command: set everything up (idempotent), then run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV="${AGENTSPEC_VENV:-.venv}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" NUMBA_NUM_THREADS="${NUMBA_NUM_THREADS:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if "$VENV/bin/agentspec" demo --help >/dev/null 2>&1; then
  exec "$VENV/bin/agentspec" demo "$@"
fi
# Until `agentspec demo` exists: replay the bundled sample trace with the default tokenizer.
exec "$VENV/bin/agentspec" replay --traces tests/fixtures/agent_sample.jsonl \
  --tokenizer default --proposers none,ngram,suffix --batch 1,8,64,256 --k 8 \
  --json out/demo_replay.json "$@"
