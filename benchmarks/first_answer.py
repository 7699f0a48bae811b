"""Time to first answer of the README's one-liner, in a fresh Python process.

Runs, in a child process (so that imports and the engine start count), what the README
shows: ``ChatAgentSpecVLLM(max_tokens=...)`` on the embedded default engine, wrapped with
``with_agentspec(create_agent(model, tools))``, then one ``invoke``. Prints, per run, the
seconds from process start to: the imports done, the engine ready (the first model call
builds it), and the first answer; plus the engine's dtype and whether it ran eager. Run it
twice or more: the first run after a boot also reads the model and vLLM from a cold disk
(and converts the default model once, if it never was); "warm" is the second run on.

    python benchmarks/first_answer.py --runs 2
    python benchmarks/first_answer.py --runs 1 --engine-option enforce_eager=false
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = float(sys.argv[1])
options = json.loads(sys.argv[2])
max_tokens = int(sys.argv[3])
from langchain.agents import create_agent
from langchain_core.tools import tool
from agentspec_mw_langgraph import ChatAgentSpecVLLM, with_agentspec

@tool
def word_count(text: str) -> int:
    '''Count the words in a text.'''
    return len(text.split())

imported = time.time() - t0
model = ChatAgentSpecVLLM(max_tokens=max_tokens, engine_options=options)
app = with_agentspec(create_agent(model, [word_count]))
backend = model.backend  # the engine starts here (otherwise at the first call)
ready = time.time() - t0
out = app.invoke({"messages": [{"role": "user", "content": "What is green tea? One sentence."}]})
answered = time.time() - t0
config = backend.llm.llm_engine.vllm_config
print(json.dumps({
    "imports_s": round(imported, 1),
    "engine_ready_s": round(ready, 1),
    "first_answer_s": round(answered, 1),
    "dtype": str(config.model_config.dtype),
    "enforce_eager": bool(config.model_config.enforce_eager),
    "answer": str(out["messages"][-1].content)[:120],
}))
"""


def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    lowered = value.lower()
    parsed: object = {"true": True, "false": False}.get(lowered, value)
    if isinstance(parsed, str) and value.lstrip("-").isdigit():
        parsed = int(value)
    return key, parsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="fresh processes to time, one by one")
    ap.add_argument("--max-tokens", type=int, default=256, help="the README's max_tokens")
    ap.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine_options entry (e.g. enforce_eager=false); repeatable",
    )
    args = ap.parse_args(argv)
    options = dict(_option(o) for o in args.engine_option)
    env = dict(os.environ)
    for run in range(1, args.runs + 1):
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, repr(t0), json.dumps(options), str(args.max_tokens)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"run {run}: " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
