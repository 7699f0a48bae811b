"""Time the decoding steps of a Llama-3.1-8B-shaped model on one GPU, for a measured preset.

No vLLM runs on the device machine this project can borrow (PyTorch and Triton only), so
this times what a vLLM step spends on the GPU with the same shapes: 32 layers of
Llama-3.1-8B (hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, vocabulary 128,256),
random bf16 weights, each step captured in a CUDA graph (vLLM's decode path runs in CUDA
graphs too) and timed with CUDA events. A step is ``B`` requests of ``q`` query tokens
each (``q - 1`` drafts) over ``L`` tokens of context, or one prefill chunk of ``T`` tokens:
RMSNorm, QKV, KV-cache write, attention, O, RMSNorm, gate/up, SiLU, down per layer, then
the LM head and argmax over every logits row (each decode and draft position; a prefill
chunk's last). Attention is timed two ways and the faster kept per step — PyTorch's SDPA
(flash) with the query heads of each KV head packed along the sequence, and two batched
matmuls around a softmax — since neither is vLLM's paged FlashAttention; RoPE, the
scheduler, input preparation and the sampler's host side are left out (the presets carry
those as ``c_oh``). What this measures is the GPU work's shape (how a step grows with
tokens and context), not vLLM end to end.

Only ``torch`` is imported, so the script runs on a bare GPU machine::

    python benchmarks/gpu_step_time.py --json out.json --budget-s 300

Steps are timed in a shuffled order and the JSON is rewritten after each, so a run cut
short by ``--budget-s`` still covers the grid evenly. ``--tiny`` runs a toy shape (on the
CPU without CUDA) to check the script; ``--config config.json`` times another decoder's
shapes (a Hugging Face config: Llama, Qwen2, Mistral keys). ``python
benchmarks/fit_gpu_steps.py out.json`` fits the presets' step-time forms to the result.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

LLAMA8B = {
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "head_dim": 128,
    "inter": 14336,
    "layers": 32,
    "vocab": 128256,
}
TINY = {
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "inter": 128,
    "layers": 2,
    "vocab": 500,
}


def shapes_of(config: dict[str, Any]) -> dict[str, int]:
    """A decoder's shapes from its Hugging Face ``config.json`` (Llama, Qwen2, Mistral keys)."""
    heads = int(config["num_attention_heads"])
    return {
        "hidden": int(config["hidden_size"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads", heads)),
        "head_dim": int(config.get("head_dim") or config["hidden_size"] // heads),
        "inter": int(config["intermediate_size"]),
        "layers": int(config["num_hidden_layers"]),
        "vocab": int(config["vocab_size"]),
    }


class Stack:
    """Random bf16 weights of the model's shapes; one KV buffer shared by the layers (each
    layer still reads it whole from memory: it is far larger than L2 wherever it matters)."""

    def __init__(self, s: dict[str, int], device: torch.device, dtype: torch.dtype) -> None:
        self.s = s
        h, hd = s["hidden"], s["head_dim"]
        qkv = (s["heads"] + 2 * s["kv_heads"]) * hd

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=dtype) * rows**-0.5

        self.layers = [
            (
                torch.ones(h, device=device, dtype=dtype),
                w(h, qkv),
                w(s["heads"] * hd, h),
                torch.ones(h, device=device, dtype=dtype),
                w(h, 2 * s["inter"]),
                w(s["inter"], h),
            )
            for _ in range(s["layers"])
        ]
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.lm_head = w(h, s["vocab"])

    def _attend(
        self,
        qx: torch.Tensor,
        kv: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        b: int,
        q: int,
        attn: str,
        prefill: bool,
    ) -> torch.Tensor:
        """One group's attention: write its new keys and values, attend over the cache."""
        s = self.s
        kvh, hd, g = s["kv_heads"], s["head_dim"], s["heads"] // s["kv_heads"]
        ctx, nq = kc.shape[2], s["heads"] * hd
        kc[:, :, ctx - q :].copy_(kv[:, : kvh * hd].view(b, q, kvh, hd).transpose(1, 2))
        vc[:, :, ctx - q :].copy_(kv[:, kvh * hd :].view(b, q, kvh, hd).transpose(1, 2))
        if prefill:
            qh = qx.view(b, q, s["heads"], hd).transpose(1, 2)
            o = F.scaled_dot_product_attention(qh, kc, vc, is_causal=True, enable_gqa=True)
            return o.transpose(1, 2).reshape(b * q, nq)
        # query heads of one KV head packed along the sequence (GQA decode kernels do this)
        qh = qx.reshape(b, q, kvh, g, hd).permute(0, 2, 3, 1, 4).reshape(b, kvh, g * q, hd)
        if attn == "sdpa":
            o = F.scaled_dot_product_attention(qh, kc, vc)
        else:
            sc = torch.matmul(qh, kc.transpose(-1, -2)) * hd**-0.5
            o = torch.matmul(torch.softmax(sc.float(), dim=-1).to(qh.dtype), vc)
        return o.view(b, kvh, g, q, hd).permute(0, 3, 1, 2, 4).reshape(b * q, nq)

    def step(self, x: torch.Tensor, groups: list[Group], attn: str) -> torch.Tensor:
        """One step over ``x`` (every group's tokens, in order); returns the argmax of
        every logits row (a decode group's every token, a prefill chunk's last)."""
        s = self.s
        nq = s["heads"] * s["head_dim"]
        for n1, wqkv, wo, n2, wgu, wd in self.layers:
            qkv = F.rms_norm(x, (s["hidden"],), n1) @ wqkv
            outs, at = [], 0
            for g in groups:
                part = qkv[at : at + g.b * g.q]
                outs.append(
                    self._attend(part[:, :nq], part[:, nq:], g.kc, g.vc, g.b, g.q, attn, g.prefill)
                )
                at += g.b * g.q
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = x + o @ wo
            gu = F.rms_norm(x, (s["hidden"],), n2) @ wgu
            x = x + (F.silu(gu[:, : s["inter"]]) * gu[:, s["inter"] :]) @ wd
        rows, at = [], 0
        for g in groups:
            part = x[at : at + g.b * g.q]
            rows.append(part.view(g.b, g.q, -1)[:, -1] if g.prefill else part)
            at += g.b * g.q
        h = rows[0] if len(rows) == 1 else torch.cat(rows)
        return (F.rms_norm(h, (s["hidden"],), self.norm) @ self.lm_head).argmax(dim=-1)


class Group(NamedTuple):
    """Requests of one kind in a step: ``b`` requests of ``q`` tokens over a cache of
    ``kc.shape[2]`` tokens (a prefill chunk: ``b = 1``, ``q`` = the chunk, causal)."""

    b: int
    q: int
    prefill: bool
    kc: torch.Tensor
    vc: torch.Tensor


def time_call(fn: Callable[[], Any], cuda: bool, target_s: float) -> float:
    """Median seconds of ``fn`` over enough calls to fill ``target_s`` (3 to 50)."""
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-5)
    n = max(3, min(50, int(target_s / est)))
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def graphed(fn: Callable[[], torch.Tensor], cuda: bool) -> Callable[[], Any]:
    """``fn`` captured in a CUDA graph (replayed by the returned callable), or ``fn``."""
    if not cuda:
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def grid(tiny: bool) -> list[tuple[int, int, int, int]]:
    """(requests, query tokens per request, context, prefill chunk) of every step: decodes
    alone (``q - 1`` drafts each), a prefill chunk alone (no requests), or both (vLLM's
    chunked prefill puts waiting prompts' chunks into decode steps)."""
    if tiny:
        return [(b, q, ctx, 0) for b in (1, 4) for q in (1, 4) for ctx in (32, 64)] + [
            (0, 0, 0, 64),
            (4, 2, 32, 16),
        ]
    out = []
    for b in (1, 4, 16, 32, 64, 128, 256):
        for ctx in (256, 1024, 4096, 16384):
            if b * ctx > 524_288:
                continue
            for q in (1, 2, 4, 8, 16):
                out.append((b, q, ctx, 0))
    out += [(0, 0, 0, chunk) for chunk in (512, 2048, 8192)]
    out += [
        (b, q, 1024, chunk) for b in (16, 64, 128) for q in (1, 4) for chunk in (256, 1024, 2048)
    ]
    out += [(32, q, 4096, chunk) for q in (1, 8) for chunk in (512, 2048)]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True, help="where to write the timed steps")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop timing after this")
    ap.add_argument("--target-s", type=float, default=0.25, help="time spent per variant")
    ap.add_argument("--seed", type=int, default=0, help="order of the shuffled grid")
    ap.add_argument("--tiny", action="store_true", help="toy shapes (a check of the script)")
    ap.add_argument(
        "--config",
        type=Path,
        help="a Hugging Face config.json whose shapes to time instead of Llama-3.1-8B's",
    )
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = TINY if a.tiny else LLAMA8B
    if a.config is not None:
        shapes = shapes_of(json.loads(a.config.read_text()))
    t_start = time.perf_counter()
    torch.manual_seed(0)
    model = Stack(shapes, device, dtype)
    meta: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "shapes": shapes,
        "columns": [
            "requests",
            "query",
            "context",
            "chunk",
            "tokens",
            "kv",
            "rows",
            "sdpa_s",
            "bmm_s",
        ],
        "steps": [],
    }
    configs = grid(a.tiny)
    random.Random(a.seed).shuffle(configs)
    print(f"{meta['device']} torch {meta['torch']}: {len(configs)} steps", flush=True)
    kvh, hd = shapes["kv_heads"], shapes["head_dim"]

    def cache(b: int, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.randn(b, kvh, ctx, hd, device=device, dtype=dtype),
            torch.randn(b, kvh, ctx, hd, device=device, dtype=dtype),
        )

    for i, (b, q, ctx, chunk) in enumerate(configs):
        if time.perf_counter() - t_start > a.budget_s:
            print(f"budget spent after {i} steps", flush=True)
            break
        groups = []
        if b:
            groups.append(Group(b, q, False, *cache(b, ctx)))
        if chunk:
            groups.append(Group(1, chunk, True, *cache(1, chunk)))
        tokens = b * q + chunk
        x = torch.randn(tokens, shapes["hidden"], device=device, dtype=dtype)
        got = {}
        for attn in ("sdpa", "bmm") if b else ("sdpa",):
            fn = graphed(functools.partial(model.step, x, groups, attn), cuda)
            got[attn] = time_call(fn, cuda, a.target_s)
            del fn
        rows = b * q + (1 if chunk else 0)
        meta["steps"].append(
            [b, q, ctx, chunk, tokens, b * ctx + chunk, rows, got["sdpa"], got.get("bmm")]
        )
        print(
            f"[{i + 1}/{len(configs)}] B={b} q={q} ctx={ctx} chunk={chunk}: "
            f"sdpa {got['sdpa'] * 1e3:.3f} ms"
            + (f", bmm {got['bmm'] * 1e3:.3f} ms" if "bmm" in got else ""),
            flush=True,
        )
        del groups, x
        if cuda:
            torch.cuda.empty_cache()
        meta["elapsed_s"] = time.perf_counter() - t_start
        with open(a.json, "w") as f:
            json.dump(meta, f)


if __name__ == "__main__":
    main()
