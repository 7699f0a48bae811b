#!/usr/bin/env bash
# The README's main-job command: set everything up (idempotent), then run a small busy-engine
# sweep (`agentspec bench`): the demo's multi-agent app at 2 (eight in all) and 24 concurrent workflows,
# without speculation, with n-gram, SuffixDecoding and AgentSpec; prints the table, one
# agent's output and which method wins where; writes out/demo_bench.{txt,png,json}.
# Extra arguments go to `agentspec bench` (e.g. --n 1,16 --repeats 3; a leading -- is dropped);
# with --show REPORT they go alone (a stored report's table, nothing run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV="${AGENTSPEC_VENV:-.venv}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# vLLM's CPU preload (tcmalloc, Intel OpenMP) is not exported here: `agentspec bench` sets it in
# each engine process's environment itself (and leaves it out of --preload off/both's variants).
if [ "${1:-}" = "--" ]; then
  shift
fi
for arg in "$@"; do
  case "$arg" in
    --show | --show=*) exec "$VENV/bin/agentspec" bench "$@" ;;
  esac
done
exec "$VENV/bin/agentspec" bench --n 2,24 --apps demo --methods none,ngram,suffix,agentspec \
  --repeats 1 --max-tokens 24 --out out/demo_bench --json out/demo_bench.json "$@"
