"""``import agentspec_mw`` pulls in no host framework; ``with_agentspec`` loads on demand."""

from __future__ import annotations

import subprocess
import sys

HOSTS = ("langgraph", "langchain", "langchain_core", "vllm", "agentspec_mw_langgraph")


def test_core_import_is_host_free_and_export_is_lazy() -> None:
    code = (
        "import sys, agentspec_mw\n"
        f"loaded = [m for m in {HOSTS!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from agentspec_mw import with_agentspec\n"
        "import agentspec_mw_langgraph\n"
        "assert with_agentspec is agentspec_mw_langgraph.with_agentspec\n"
        "assert 'langgraph' in sys.modules\n"
        "try:\n"
        "    agentspec_mw.nope\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('missing attribute did not raise')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
