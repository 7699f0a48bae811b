"""The first embedded engine is freed once it is shut down and its model objects dropped.

vLLM keeps an exception from its import in a module global whose traceback holds every
frame on the stack when that module was first imported
(``vllm.multimodal.media.audio._torchcodec_import_exc``); imported under the first
engine build or request, those frames held the model object and its engine forever.
Run in a fresh interpreter: vLLM must not be imported yet.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

_SCRIPT = textwrap.dedent(
    """
    import gc, sys, weakref
    from transformers import AutoTokenizer

    import agentspec_mw_vllm.engine as engine_mod
    from agentspec_mw_langgraph import ChatAgentSpecVLLM
    from agentspec_mw_langgraph.shared import release_shared_engines
    from tests.langgraph.fake_engine import FakeLLM, FakeStepEngine

    assert "vllm" not in sys.modules
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    refs = []

    def fake_build_llm(model, **kwargs):
        llm = FakeLLM(tokenizer, FakeStepEngine(lambda ids: "hello"))
        refs.append(weakref.ref(llm))
        return llm

    engine_mod.build_llm = fake_build_llm

    def use(**options):
        model = ChatAgentSpecVLLM(max_tokens=8, **options)
        assert model.invoke("hi").content == "hello"
        list(model.stream("hi"))
        return weakref.ref(model)

    models = [use(), use(share_engine=False)]
    assert "vllm" in sys.modules  # the first build / request imported it
    release_shared_engines()
    engine_mod.shutdown(refs[1]())
    gc.collect()
    print("alive:", [r() is not None for r in models + refs])
    """
)


def test_the_first_embedded_engine_is_freed(tiny_tokenizer_dir: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tiny_tokenizer_dir)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alive: [False, False, False, False]" in done.stdout, done.stdout + done.stderr[-2000:]
