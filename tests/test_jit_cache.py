"""``jit.kernel``: a cached kernel recompiles when a helper in a sibling module changes.

Plain ``njit(cache=True)`` would load the stale kernel (numba stamps only the kernel's own
file); each run here is a fresh interpreter, as after a ``git pull``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HELPER = """
from numba import njit

@njit(nogil=True, inline="always")
def helper(x):
    return x + {step}
"""

CALLER = """
from agentspec_mw.agentspec.jit import kernel
from helper_mod import helper

@kernel(nogil=True)
def caller(x):
    return helper(x) * 10
"""

RUN = """
import json
from caller_mod import caller
value = caller(1)
print(json.dumps({"value": int(value), "hits": sum(caller.stats.cache_hits.values())}))
"""


def _run(directory: Path) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(directory), *sys.path])
    command = [sys.executable, "-c", RUN]
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_kernel_recompiles_when_only_a_sibling_module_changes(tmp_path: Path) -> None:
    (tmp_path / "helper_mod.py").write_text(HELPER.format(step=1))
    (tmp_path / "caller_mod.py").write_text(CALLER)
    assert _run(tmp_path) == {"value": 20, "hits": 0}  # compiled, saved
    assert _run(tmp_path) == {"value": 20, "hits": 1}  # loaded from the cache
    time.sleep(0.01)
    (tmp_path / "helper_mod.py").write_text(HELPER.format(step=2))  # caller_mod.py untouched
    assert _run(tmp_path) == {"value": 30, "hits": 0}  # recompiled, not the stale kernel
    assert _run(tmp_path) == {"value": 30, "hits": 1}
