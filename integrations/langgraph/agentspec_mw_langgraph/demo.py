"""``agentspec demo``: the multi-agent workflow (:mod:`.demo_graph`) on the embedded engine,
once per drafter — no speculation, SuffixDecoding (vLLM's ``suffix``), AgentSpec — with a
side-by-side table, an identical-outputs check and a PNG.

Each drafter gets a fresh in-process engine (built, warmed up with one untimed request,
used, shut down before the next is built: vLLM's in-process engines share process-wide
state). The graph is wrapped with :func:`~agentspec_mw_langgraph.with_agentspec` in every
run, so the requests are the same; only the drafter differs. Metrics come from the engine:
each request's speculative-decoding summary (``per_request_spec_decode_metrics``), summed
per agent by the request's ``agentspec_agent`` tag.

Definitions (per run): *tokens/s* = output tokens / wall time of the workflow; *accepted
per step* = accepted draft tokens / decoding steps, a step being one forward pass of one
request (steps = output tokens − accepted tokens, since each step emits its accepted
drafts plus one token); *rejection rate* = 1 − accepted / drafted draft tokens.

With ``server_url`` the workflow runs once against that vLLM server (whatever drafter it
was started with, e.g. ``agentspec serve``), through ``ChatOpenAI`` with the tags sent as
``vllm_xargs``; drafted/accepted counts are read from the server's ``/metrics``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentspec_mw.tags import WIRE_PREFIX
from agentspec_mw_langgraph.backend import (
    GenerationRequest,
    VLLMBackend,
)
from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.demo_graph import build_workflow, initial_state
from agentspec_mw_langgraph.wrap import with_agentspec

__all__ = [
    "DEFAULT_TOPICS",
    "DRAFTERS",
    "AgentCounts",
    "DemoRun",
    "MeteredBackend",
    "format_table",
    "outputs_identical",
    "plot_runs",
    "run_demo",
    "run_engine",
    "run_server",
]

#: The runs of the demo: (label, ``build_llm(speculative=...)``).
DRAFTERS: tuple[tuple[str, str | None], ...] = (
    ("none", None),
    ("suffix", "suffix"),
    ("agentspec", "agentspec"),
)
#: One query per topic, run concurrently (``graph.batch``).
DEFAULT_TOPICS: tuple[str, ...] = ("tea", "coffee")

Progress = Callable[[str], None]


@dataclass
class AgentCounts:
    """Token counts of one agent's requests (or of a whole run)."""

    requests: int = 0
    output_tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, other: AgentCounts) -> None:
        """Add ``other``'s counts to these."""
        self.requests += other.requests
        self.output_tokens += other.output_tokens
        self.drafted += other.drafted
        self.accepted += other.accepted

    @property
    def steps(self) -> int:
        """Decoding steps (one forward pass of one request each)."""
        return max(self.output_tokens - self.accepted, 0)

    @property
    def accepted_per_step(self) -> float:
        """Accepted draft tokens per decoding step."""
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted draft tokens (``None`` when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def rejection(self) -> float | None:
        """1 − acceptance (``None`` when nothing was drafted)."""
        acc = self.acceptance
        return None if acc is None else 1.0 - acc


@dataclass
class DemoRun:
    """One run of the workflow on one drafter."""

    label: str
    wall_s: float
    engine_start_s: float
    total: AgentCounts
    per_agent: dict[str, AgentCounts]
    outputs: list[dict[str, Any]]
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of workflow wall time."""
        return self.total.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def _spec_counts(completion: Any) -> tuple[int, int]:
    """(drafted, accepted) of one completion's per-request spec-decode summary."""
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return 0, 0
    histogram = list(getattr(metrics, "histogram", []) or [])
    accepted = sum(j * n for j, n in enumerate(histogram))
    return int(getattr(metrics, "num_draft_tokens", 0)), int(accepted)


class MeteredBackend(VLLMBackend):
    """A :class:`VLLMBackend` that also counts each request's tokens per agent tag."""

    def __init__(self, llm: Any) -> None:
        super().__init__(llm)
        self._lock = threading.Lock()
        self.per_agent: dict[str, AgentCounts] = defaultdict(AgentCounts)

    def reset(self) -> None:
        """Forget the counts so far."""
        with self._lock:
            self.per_agent = defaultdict(AgentCounts)

    def _observe(self, request: GenerationRequest, completion: Any) -> None:
        drafted, accepted = _spec_counts(completion)
        agent = str((request.extra_args or {}).get(f"{WIRE_PREFIX}agent", "untagged"))
        with self._lock:
            counts = self.per_agent[agent]
            counts.requests += 1
            counts.output_tokens += len(completion.token_ids)
            counts.drafted += drafted
            counts.accepted += accepted


def _totals(per_agent: dict[str, AgentCounts]) -> AgentCounts:
    total = AgentCounts()
    for counts in per_agent.values():
        total.add(counts)
    return total


def run_engine(
    label: str,
    speculative: str | None,
    *,
    model: str | None = None,
    k: int = 8,
    max_tokens: int = 48,
    topics: Sequence[str] = DEFAULT_TOPICS,
    progress: Progress = print,
    **engine_options: Any,
) -> DemoRun:
    """Run the workflow on a fresh embedded engine with ``speculative`` (then shut it down).

    ``engine_options`` go to :func:`agentspec_mw_vllm.engine.build_llm` (defaults here:
    ``enforce_eager=True``, ``max_model_len=2048``, ``max_num_seqs=16``,
    ``dtype="float32"``: in bfloat16, verifying k drafts in one forward pass rounds
    differently from decoding one token, and a near-tie between two tokens can flip --
    float32 keeps the greedy outputs of the three runs comparable token for token).
    """
    from agentspec_mw_langgraph.engine_chat import ChatAgentSpecVLLM
    from agentspec_mw_vllm.engine import build_llm, shutdown
    from agentspec_mw_vllm.metrics import get_metrics

    options: dict[str, Any] = {
        "enforce_eager": True,
        "max_model_len": 2048,
        "max_num_seqs": 16,
        "disable_log_stats": False,
        "dtype": "float32",
    }
    if speculative is not None:  # vLLM refuses per-request spec metrics without speculation
        options["per_request_spec_decode_metrics"] = "summary"
    options.update(engine_options)
    progress(f"[{label}] starting the engine (speculative={speculative}, k={k})")
    t0 = time.perf_counter()
    llm = build_llm(model, speculative=speculative, k=k, **options)
    try:
        from vllm import SamplingParams

        llm.generate(["Hello"], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        backend = MeteredBackend(llm)
        chat = ChatAgentSpecVLLM(engine=backend, max_tokens=max_tokens)
        chat.invoke("Hello")  # warm-up of the chat path (template, tokenizer), not timed
        backend.reset()
        start_s = time.perf_counter() - t0
        progress(f"[{label}] engine ready in {start_s:.0f} s; running {len(topics)} queries")
        app = with_agentspec(build_workflow(chat), config=TaggingConfig())
        faults0 = get_metrics().snapshot().faults
        t1 = time.perf_counter()
        outputs = [dict(o) for o in app.batch([initial_state(t) for t in topics])]
        wall = time.perf_counter() - t1
        faults1 = get_metrics().snapshot().faults
    finally:
        shutdown(llm)
    per_agent = dict(backend.per_agent)
    run = DemoRun(
        label=label,
        wall_s=wall,
        engine_start_s=start_s,
        total=_totals(per_agent),
        per_agent=per_agent,
        outputs=outputs,
        faults={
            key: n - faults0.get(key, 0) for key, n in faults1.items() if n > faults0.get(key, 0)
        },
    )
    progress(
        f"[{label}] done: {wall:.1f} s, {run.total.output_tokens} tokens, "
        f"{run.tokens_per_s:.1f} tokens/s"
    )
    return run


_METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<v>\S+)$")


def _scrape(client: httpx.Client, metrics_url: str) -> dict[tuple[str, str], float]:
    """``{(name, labels): value}`` from a Prometheus text endpoint."""
    out: dict[tuple[str, str], float] = {}
    for line in client.get(metrics_url).text.splitlines():
        m = _METRIC_LINE.match(line.strip())
        if m and not line.startswith("#"):
            try:
                out[(m["name"], m["labels"] or "")] = float(m["v"])
            except ValueError:
                continue
    return out


def _agent_of(labels: str) -> str:
    m = re.search(r'agent="([^"]*)"', labels)
    return m.group(1) if m else "all"


def run_server(
    server_url: str,
    *,
    model: str | None = None,
    max_tokens: int = 48,
    topics: Sequence[str] = DEFAULT_TOPICS,
    progress: Progress = print,
    transport: httpx.BaseTransport | None = None,
) -> DemoRun:
    """Run the workflow once against the vLLM server at ``server_url`` (``.../v1``).

    ``model=None`` takes the server's first served model. ``transport`` replaces the
    HTTP transport of every request (tests).
    """
    from agentspec_mw_langgraph.openai import agentspec_chat_openai

    base = server_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    client = httpx.Client(transport=transport, timeout=60)
    if model is None:
        model = str(client.get(f"{base}/models").json()["data"][0]["id"])
    progress(f"[server] {base}, model {model}")
    chat = agentspec_chat_openai(
        transport=transport,
        model=model,
        base_url=base,
        api_key="unused",
        max_tokens=max_tokens,
        temperature=0,
        max_retries=0,
    )
    app = with_agentspec(build_workflow(chat), config=TaggingConfig())
    before = _scrape(client, f"{root}/metrics")
    t0 = time.perf_counter()
    outputs = [dict(o) for o in app.batch([initial_state(t) for t in topics])]
    wall = time.perf_counter() - t0
    after = _scrape(client, f"{root}/metrics")

    def delta(name: str) -> dict[str, float]:
        got: dict[str, float] = defaultdict(float)
        for (n, labels), v in after.items():
            if n == name:
                got[_agent_of(labels)] += v - before.get((n, labels), 0.0)
        return got

    per_agent: dict[str, AgentCounts] = {}
    drafted = delta("agentspec_drafted_tokens_total")
    accepted = delta("agentspec_accepted_tokens_total")
    for agent in drafted:
        per_agent[agent] = AgentCounts(drafted=int(drafted[agent]), accepted=int(accepted[agent]))
    total = AgentCounts(
        output_tokens=int(sum(delta("vllm:generation_tokens_total").values())),
        drafted=int(sum(delta("vllm:spec_decode_num_draft_tokens_total").values())),
        accepted=int(sum(delta("vllm:spec_decode_num_accepted_tokens_total").values())),
    )
    run = DemoRun("server", wall, 0.0, total, per_agent, outputs)
    progress(f"[server] done: {wall:.1f} s, {total.output_tokens} tokens")
    return run


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def format_table(runs: Sequence[DemoRun]) -> str:
    """The side-by-side table: one column per run."""
    agents = sorted({a for r in runs for a in r.per_agent})
    rows: list[tuple[str, list[str]]] = [
        ("wall time (s)", [f"{r.wall_s:.1f}" for r in runs]),
        ("output tokens", [str(r.total.output_tokens) for r in runs]),
        ("tokens/s", [f"{r.tokens_per_s:.1f}" for r in runs]),
        ("speedup vs first", [f"{runs[0].wall_s / r.wall_s:.2f}x" for r in runs]),
        ("accepted/step", [f"{r.total.accepted_per_step:.2f}" for r in runs]),
        ("drafted tokens", [str(r.total.drafted) for r in runs]),
        ("rejection rate", [_pct(r.total.rejection) for r in runs]),
    ]
    for agent in agents:
        rows.append(
            (
                f"acceptance: {agent}",
                [
                    _pct(r.per_agent[agent].acceptance) if agent in r.per_agent else "-"
                    for r in runs
                ],
            )
        )
    if any(r.faults for r in runs):
        rows.append(("proposer faults", [str(sum(r.faults.values())) for r in runs]))
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r.label), *(len(v[i]) for _, v in rows)) for i, r in enumerate(runs)]
    head = f"{'':<{width}}  " + "  ".join(
        f"{r.label:>{c}}" for r, c in zip(runs, cols, strict=True)
    )
    lines = [head, "-" * len(head)]
    for name, values in rows:
        lines.append(
            f"{name:<{width}}  " + "  ".join(f"{v:>{c}}" for v, c in zip(values, cols, strict=True))
        )
    return "\n".join(lines)


def plot_runs(runs: Sequence[DemoRun], path: str | Path) -> Path:
    """Write a PNG: tokens/s per run, and acceptance per agent per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [r.label for r in runs]
    colors = [f"C{i}" for i in range(len(runs))]
    ax1.bar(labels, [r.tokens_per_s for r in runs], color=colors)
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("throughput of the workflow")
    agents = sorted({a for r in runs for a in r.per_agent})
    drafting = [(i, r) for i, r in enumerate(runs) if r.total.drafted]  # "none" has no bars
    width = 0.8 / max(len(drafting), 1)
    for slot, (i, r) in enumerate(drafting):
        values = [(r.per_agent[a].acceptance or 0.0) if a in r.per_agent else 0.0 for a in agents]
        xs = [j + slot * width for j in range(len(agents))]
        ax2.bar(xs, values, width, label=r.label, color=colors[i])
    ax2.set_xticks([j + width * (len(drafting) - 1) / 2 for j in range(len(agents))])
    ax2.set_xticklabels(agents, rotation=20)
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("draft acceptance")
    ax2.set_title("acceptance per agent")
    if drafting:
        ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def outputs_identical(runs: Sequence[DemoRun]) -> bool:
    """True when every run produced the first run's final states."""
    return all(r.outputs == runs[0].outputs for r in runs[1:])


_PROPOSER_OPTIONS = ("cost_model", "proposer_options")


def _options_for(spec: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for a run drafting with ``spec``: without this project's proposer
    options where ``spec`` runs none of its proposers (no drafter, vLLM's own methods),
    which :func:`agentspec_mw_vllm.engine.check_drafter_options` refuses."""
    from agentspec_mw_vllm.engine import VLLM_METHODS

    if spec is None or spec in VLLM_METHODS:
        return {k: v for k, v in options.items() if k not in _PROPOSER_OPTIONS}
    return options


def run_demo(
    *,
    model: str | None = None,
    server_url: str | None = None,
    k: int = 8,
    max_tokens: int = 48,
    topics: Sequence[str] = DEFAULT_TOPICS,
    drafters: Sequence[tuple[str, str | None]] = DRAFTERS,
    out: str | Path = "out/demo",
    progress: Progress = print,
    **engine_options: Any,
) -> list[DemoRun]:
    """Run the demo, print the table and the identical-outputs verdict, write
    ``<out>.png`` and ``<out>.txt`` (the table); return the runs. ``engine_options`` go to
    every run's engine, but ``cost_model`` and ``proposer_options`` (this project's
    proposers' options) only to the runs of such a proposer."""
    if server_url is not None:
        runs = [
            run_server(
                server_url, model=model, max_tokens=max_tokens, topics=topics, progress=progress
            )
        ]
    else:
        runs = [
            run_engine(
                label,
                spec,
                model=model,
                k=k,
                max_tokens=max_tokens,
                topics=topics,
                progress=progress,
                **_options_for(spec, engine_options),
            )
            for label, spec in drafters
        ]
    table = format_table(runs)
    verdict = (
        "outputs identical across runs: " + ("yes" if outputs_identical(runs) else "NO")
        if len(runs) > 1
        else "one run (a server runs one drafter): no comparison"
    )
    print(table)
    print(verdict)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(f"{table}\n{verdict}\n")
    png = plot_runs(runs, out.with_suffix(".png"))
    print(f"wrote {png} and {out.with_suffix('.txt')}")
    return runs
