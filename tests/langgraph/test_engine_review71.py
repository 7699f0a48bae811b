"""Review 71 of the embedded engine's plumbing (fakes only, no vLLM engine):

* the shared-engine registry keys on the effective build arguments (``engine_kwargs``):
  equal settings spelled differently share one engine, a nested option mutated after a
  build is not mistaken for the old one, and options ``build_llm`` would refuse are
  refused rather than matched;
* a private engine (``share_engine=False``) and its engine loop thread are freed once
  the model objects on it are gone;
* an engine used in a parent process fails at once in a forked child (it would hang),
  and the child's registry starts empty;
* a request whose consumer is gone leaves no entry in ``VLLMBackend._sinks``.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue
import time
import weakref
from typing import Any

import pytest

from agentspec_mw.default_model import resolve_model
from agentspec_mw_langgraph import ChatAgentSpecVLLM
from agentspec_mw_langgraph.async_backend import AsyncEngineLoopError, AsyncVLLMBackend
from agentspec_mw_langgraph.backend import GenerationRequest, VLLMBackend, sampling_params
from agentspec_mw_langgraph.batching import EngineLoop, EngineLoopError
from agentspec_mw_langgraph.shared import release_shared_engines, shared_engine, shared_engines

from .fake_engine import FakeLLM, FakeStepEngine
from .test_engine_loop import _FakeAsyncLLM

WAIT_S = 5.0  # only ever reached when the behaviour under test is broken


# --- 1. the registry keys on the effective build arguments ------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({}, {"model": "default"}),
        ({}, {"model": "<resolved>"}),
        ({}, {"engine_options": {"seed": 0}}),  # build_llm's default seed
        ({"speculative": None, "k": 4}, {"speculative": None, "k": 8}),  # k unused
    ],
    ids=["model-None-vs-default", "model-None-vs-folder", "seed-default", "k-without-spec"],
)
def test_equal_build_arguments_share_one_engine(
    builds: list[FakeLLM], a: dict[str, Any], b: dict[str, Any]
) -> None:
    if b.get("model") == "<resolved>":
        b = {"model": resolve_model(None)}
    first, second = ChatAgentSpecVLLM(**a), ChatAgentSpecVLLM(**b)
    assert first.backend is second.backend
    assert first.engine is second.engine and len(builds) == 1


def test_a_nested_option_mutated_after_a_build_is_another_engine(builds: list[FakeLLM]) -> None:
    options: dict[str, Any] = {"proposer_options": {"index_max_tokens": 1024}}
    first = ChatAgentSpecVLLM(engine_options=options)
    assert first.invoke("a").content == "engine1"
    options["proposer_options"]["index_max_tokens"] = 2048  # reused for the next model
    second = ChatAgentSpecVLLM(engine_options=options)
    assert second.invoke("b").content == "engine2"
    assert first.engine is not second.engine and len(builds) == 2


def test_shared_engine_keeps_a_deep_copy_of_the_settings() -> None:
    release_shared_engines()
    try:
        settings: dict[str, Any] = {"model": "m", "extra": {"x": [1]}}
        first = shared_engine(settings, object)
        settings["extra"]["x"].append(2)
        second = shared_engine(settings, object)
        assert first is not second
        assert shared_engine({"model": "m", "extra": {"x": [1]}}, object) is first
    finally:
        release_shared_engines()


def test_options_build_llm_refuses_are_refused_not_matched(builds: list[FakeLLM]) -> None:
    first = ChatAgentSpecVLLM(max_model_len=4096)
    assert first.invoke("a").content == "engine1"
    # the field max_model_len (2048) and the option: build_llm gets max_model_len twice
    twice = ChatAgentSpecVLLM(engine_options={"max_model_len": 4096})
    with pytest.raises(TypeError, match="max_model_len"):
        _ = twice.backend
    assert len(builds) == 1


# --- 2. a private engine is freed with its model objects --------------------------------


@pytest.fixture()
def vllm_imported() -> None:
    """Import vLLM's ``SamplingParams`` first: the import of vLLM keeps the frames of the
    call that first imports it alive (and so that call's model object)."""
    sampling_params(GenerationRequest(prompt_token_ids=[1], max_tokens=1))


def _collected(refs: list[weakref.ref[Any]]) -> bool:
    """Whether every referent is collected once the loop threads are idle (a thread
    holds its loop until it is done with the request it just finished)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        gc.collect()
        if all(ref() is None for ref in refs) or time.monotonic() > deadline:
            return all(ref() is None for ref in refs)
        time.sleep(0.01)


def test_an_engine_loop_and_its_thread_are_freed_when_dropped() -> None:
    loop = EngineLoop(FakeStepEngine())
    got: queue.SimpleQueue[Any] = queue.SimpleQueue()
    loop.submit({"prompt_token_ids": [1, 2]}, None, got.put)
    while not getattr(got.get(timeout=WAIT_S), "finished", False):
        pass
    thread, ref = loop._thread, weakref.ref(loop)
    assert thread is not None and thread.is_alive()
    del loop
    assert _collected([ref])
    thread.join(WAIT_S)
    assert not thread.is_alive()


@pytest.mark.usefixtures("vllm_imported")
def test_private_engines_are_freed_with_their_models(builds: list[FakeLLM]) -> None:
    engines, threads = [], []
    for _ in range(3):
        model = ChatAgentSpecVLLM(share_engine=False)
        assert model.invoke("hello").content.startswith("engine")
        backend = model.backend
        assert isinstance(backend, VLLMBackend) and backend.loop._thread is not None
        engines.append(weakref.ref(model.engine))
        threads.append(backend.loop._thread)
        del model, backend
    builds.clear()  # the fixture's list of built engines
    assert _collected(engines)
    for thread in threads:
        thread.join(WAIT_S)
    assert not any(thread.is_alive() for thread in threads)


# --- 3. an engine the parent used fails at once in a forked child -----------------------


def _in_child(call: Any) -> tuple[str, str]:
    try:
        return "ok", str(call())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return type(exc).__name__, str(exc)


def _run_forked(call: Any) -> tuple[str, str]:
    ctx = mp.get_context("fork")
    results = ctx.SimpleQueue()
    child = ctx.Process(target=lambda: results.put(_in_child(call)), daemon=True)
    child.start()
    child.join(WAIT_S * 2)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child hung")
    assert child.exitcode == 0
    return results.get()  # type: ignore[no-any-return]


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="no fork here")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork of a threaded process
def test_an_engine_used_before_a_fork_fails_at_once_in_the_child(
    builds: list[FakeLLM], tiny_tokenizer: Any
) -> None:
    shared_model = ChatAgentSpecVLLM()
    assert shared_model.invoke("x").content == "engine1"
    async_model = ChatAgentSpecVLLM(engine=AsyncVLLMBackend(_FakeAsyncLLM(tiny_tokenizer)))
    assert async_model.invoke("x").content == "ok!"

    kind, message = _run_forked(lambda: shared_model.invoke("x").content)
    assert kind == EngineLoopError.__name__ and "forked" in message, message
    kind, message = _run_forked(lambda: async_model.invoke("x").content)
    assert kind == AsyncEngineLoopError.__name__ and "forked" in message, message
    # the child's registry starts empty: a new model builds the child's own engine
    fresh = _run_forked(lambda: (len(shared_engines()), ChatAgentSpecVLLM().invoke("x").content))
    assert fresh == ("ok", str((0, "engine2")))
    assert shared_model.invoke("x").content == "engine1"  # the parent's still serves
    assert async_model.invoke("x").content == "ok!"
    async_model.backend.close()  # type: ignore[attr-defined]


# --- 4. no backend entry outlives a request whose consumer is gone ----------------------


def test_a_sink_that_raises_leaves_no_backend_entry(tiny_tokenizer: Any) -> None:
    engine = FakeStepEngine(lambda ids: "y" * 200, step_s=0.002)
    backend = VLLMBackend(FakeLLM(tiny_tokenizer, engine))

    def gone(output: Any) -> None:
        raise RuntimeError("Event loop is closed")  # what call_soon_threadsafe raises

    backend._submit(GenerationRequest(prompt_token_ids=[1, 2], max_tokens=200), gone)
    deadline = time.monotonic() + WAIT_S
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(engine.aborted) == 1  # the engine loop dropped the request
    assert backend._sinks == {}
    backend.close()
