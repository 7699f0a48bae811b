"""Replay arithmetic on hand-made cases, the peers on the sample, and the CLI end to end."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from agentspec_mw.cli import main
from agentspec_mw.costmodel import PRESETS, get_cost_model
from agentspec_mw.peers.none import NoProposer
from agentspec_mw.proposer import EMPTY_DRAFT, Draft, StepContext, TokenIds
from agentspec_mw.registry import make_proposer
from agentspec_mw.replay.run import ReplayConfig, build_calls, order_runs, run_replay
from agentspec_mw.replay.sim import ReplayCall, replay_workload
from agentspec_mw.traces.tokenized import tokenize_trace
from tests.helpers import Wrong

COST = get_cost_model("llama8b-h100")


class Oracle:
    """Drafts exactly the recorded continuation (a perfect proposer)."""

    name = "oracle"

    def __init__(self, truth: dict[str, np.ndarray]) -> None:
        self.truth = truth
        self.pos: dict[str, int] = {}

    def start(self, req_id: str, prompt_ids: TokenIds, tags: object = None) -> None:
        self.pos[req_id] = 0

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        self.pos[req_id] += len(token_ids)

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        return [
            Draft(tuple(self.truth[r][self.pos[r] : self.pos[r] + k].tolist())) for r in req_ids
        ]

    def stop(self, req_id: str) -> None:
        del self.pos[req_id]


def _calls(lengths: list[int], runs: int = 1) -> list[ReplayCall]:
    out = []
    for i, n in enumerate(lengths):
        out.append(
            ReplayCall(
                req_id=f"r{i}",
                run_id=f"run{i % runs}",
                prompt=np.arange(10, dtype=np.int32),
                output=np.arange(100, 100 + n, dtype=np.int32),
            )
        )
    return out


def test_none_gives_exactly_one_token_per_step() -> None:
    calls = _calls([1, 7, 30, 0], runs=2)
    r = replay_workload(calls, NoProposer(), batch=2, k=8, cost_model=COST)
    assert r.output_tokens == 38 and r.steps == 38 and r.mat == 1.0
    assert r.drafted == 0 and r.rejection_rate == 0.0


@pytest.mark.parametrize("k", [1, 4, 8])
def test_perfect_proposer_gives_k_plus_one_until_the_tail(k: int) -> None:
    n = 50
    calls = _calls([n])
    oracle = Oracle({"r0": calls[0].output})
    r = replay_workload(calls, oracle, batch=1, k=k, cost_model=COST)
    # prefill emits 1 token, then ceil((n - 1) / (k + 1)) verification steps
    assert r.steps == 1 + -(-(n - 1) // (k + 1))
    assert r.rejection_rate == 0.0
    assert r.accepted == r.drafted


def test_wrong_proposer_rejects_everything_and_costs_time() -> None:
    calls = _calls([20, 20])
    base = replay_workload(calls, NoProposer(), batch=2, k=4, cost_model=COST)
    r = replay_workload(calls, Wrong(), batch=2, k=4, cost_model=COST)
    assert r.steps == base.steps and r.rejection_rate == 1.0
    assert r.sim_time_s > base.sim_time_s


def test_runs_are_sequential_and_batch_counts_runs_in_flight() -> None:
    seen: list[tuple[str, ...]] = []

    class Spy(NoProposer):
        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            seen.append(tuple(req_ids))
            assert step.batch_size <= 2
            return [EMPTY_DRAFT] * len(req_ids)

    # calls r0, r2 belong to run0; r1, r3 to run1: never two of one run at once
    replay_workload(_calls([3, 3, 3, 3], runs=2), Spy(), batch=4, k=2, cost_model=COST)
    for ids in seen:
        runs = [int(r[1:]) % 2 for r in ids]
        assert len(runs) == len(set(runs))


def test_overlong_draft_is_an_error() -> None:
    class TooLong(Wrong):
        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            return [Draft((1,) * (k + 1)) for _ in req_ids]

    with pytest.raises(RuntimeError, match="> k="):
        replay_workload(_calls([5]), TooLong(), batch=1, k=2, cost_model=COST)


def test_cost_model_forms() -> None:
    lin, roof = PRESETS["llama8b-h100"], PRESETS["llama8b-h100-roofline"]
    assert lin.step_time(1, 0) == pytest.approx(5.886e-3 + 21e-6 + 1.207e-3)
    assert lin.marginal_token_cost(10, 1000) == pytest.approx(21e-6)
    # roofline: batched tokens are free below the ridge, then cost c_tok each
    assert roof.marginal_token_cost(10, 0) == 0.0
    assert roof.marginal_token_cost(1000, 0) == pytest.approx(21e-6)
    # ridge: the same below and above the ridge, but the KV read is never hidden
    ridge = PRESETS["llama8b-h200"]
    ridge_n = ridge.c_fix / ridge.c_tok
    row = ridge.c_row
    assert ridge.marginal_token_cost(10, 5e5) == pytest.approx(row)
    assert ridge.marginal_token_cost(2 * ridge_n, 5e5) == pytest.approx(ridge.c_tok + row)
    assert ridge.step_time(10, 2e5) - ridge.step_time(10, 1e5) == pytest.approx(1e5 * ridge.c_kv)
    # the roofline hides KV reads under a compute-bound step, and tokens under a long KV read
    assert roof.step_time(4000, 2e5) == roof.step_time(4000, 1e5)
    assert roof.marginal_token_cost(400, 5e5) == 0.0 < ridge.marginal_token_cost(400, 5e5)
    nb = np.array([1.0, 50.0, 400.0, 4000.0])
    assert ridge.step_time_array(nb, 3e4) == pytest.approx(
        [ridge.step_time(x, 3e4) for x in nb], rel=1e-12
    )
    with pytest.raises(ValueError, match="not a preset"):
        get_cost_model("nope")


@pytest.fixture(scope="module")
def sample_calls(tiny_tokenizer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from tests.conftest import SAMPLE

    tr = tokenize_trace(
        SAMPLE, tiny_tokenizer, cache_dir=tmp_path_factory.mktemp("c"), progress=False
    )
    return build_calls([tr])


@pytest.mark.peers
@pytest.mark.parametrize("name", ["ngram", "suffix"])
def test_peers_draft_on_the_sample_and_respect_k(name: str, sample_calls) -> None:  # type: ignore[no-untyped-def]
    for k in (1, 4):
        r = replay_workload(
            sample_calls["sample_tool_agent"], make_proposer(name), batch=1, k=k, cost_model=COST
        )
        assert r.drafted > 0 and r.accepted > 0
        assert r.mat > 1.0
        assert r.drafted <= k * r.steps


@pytest.mark.peers
def test_stateless_ngram_counts_do_not_depend_on_batch(sample_calls) -> None:  # type: ignore[no-untyped-def]
    calls = sample_calls["sample_tool_agent"] + sample_calls["sample_react"]
    counts = {
        b: (lambda r: (r.steps, r.drafted, r.accepted))(
            replay_workload(calls, make_proposer("ngram"), batch=b, k=4, cost_model=COST)
        )
        for b in (1, 2, 8)
    }
    assert len(set(counts.values())) == 1


@pytest.mark.peers
def test_same_inputs_same_numbers(sample_calls) -> None:  # type: ignore[no-untyped-def]
    cfg = ReplayConfig(
        traces=["x"], tokenizer="t", proposers=["none", "suffix"], batch=[1, 4], k=[4]
    )
    a = run_replay(cfg, sample_calls, progress=False)
    b = run_replay(cfg, sample_calls, progress=False)
    assert [r.model_dump(exclude={"propose_us_p50", "propose_us_p99"}) for r in a] == [
        r.model_dump(exclude={"propose_us_p50", "propose_us_p99"}) for r in b
    ]
    assert {r.workload for r in a} == {"sample_tool_agent", "sample_react", "ALL"}


@pytest.mark.peers
def test_cli_end_to_end(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out.json"
    rc = main(
        [
            "replay",
            "--traces",
            str(sample_path),
            "--tokenizer",
            str(tiny_tokenizer_dir),
            "--proposers",
            "none,ngram,suffix",
            "--batch",
            "1,4",
            "--k",
            "4",
            "--json",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--set",
            "suffix.min_token_prob=0.1",
            "--run-order",
            "shuffle:3",
            "--max-num-batched-tokens",
            "4096",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "suffix" in printed and "speedup" in printed
    report = json.loads(out.read_text())
    assert report["version"] == 1 and report["config"]["k"] == [4]
    assert report["config"]["run_order"] == "shuffle:3"
    keys = {
        "proposer",
        "workload",
        "batch",
        "k",
        "calls",
        "output_tokens",
        "steps",
        "mat",
        "rejection_rate",
        "drafted_per_step",
        "propose_us_p50",
        "propose_us_p99",
        "speedup",
        "max_in_flight",
    }
    added = {
        "effective_batch",
        "batch_filled",
        "throughput_tok_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "prefill_tokens",
        "prefix_hit_rate",
        "preemptions",
        "kv_waits",
        "sim_time_s",
        "propose_steps",
    }
    assert all(keys | added == set(r) for r in report["results"])  # old fields kept
    assert report["limits"]["max_num_batched_tokens"] == 4096  # the preset's is 8192
    assert (
        report["limits"]["kv_capacity_tokens"] == PRESETS["llama8b-h100"].limits.kv_capacity_tokens
    )
    assert "eff_batch" in printed and "ttft_p50" in printed
    rows = {(r["proposer"], r["workload"], r["batch"]): r for r in report["results"]}
    assert rows[("none", "ALL", 1)]["mat"] == 1.0 and rows[("none", "ALL", 4)]["speedup"] == 1.0
    # the sample's workloads have 2 and 3 runs: "batch 4" never has 4 calls in flight
    assert rows[("suffix", "sample_react", 1)]["max_in_flight"] == 1
    assert rows[("suffix", "sample_react", 4)]["max_in_flight"] == 2
    assert rows[("suffix", "sample_tool_agent", 4)]["max_in_flight"] == 3
    assert rows[("suffix", "ALL", 4)]["max_in_flight"] == 3
    assert rows[("suffix", "sample_react", 4)]["batch_filled"] is False  # at most 2 of 4
    assert rows[("suffix", "sample_react", 1)]["batch_filled"] is True
    assert "* effective batch under 80 % of the batch" in printed
    assert "note: sample_react: at batch 4 at most 2 calls were in flight" in printed
    assert "note: sample_tool_agent: at batch 4 at most 3 calls were in flight" in printed
    assert rows[("suffix", "ALL", 1)]["mat"] > 1.0
    # proposer-time percentiles cover the steps with a propose: none (k = 0) has none
    assert rows[("none", "ALL", 4)]["propose_steps"] == 0
    assert rows[("none", "ALL", 4)]["propose_us_p50"] == 0.0
    assert rows[("suffix", "ALL", 4)]["propose_steps"] > 0
    assert rows[("suffix", "ALL", 4)]["propose_us_p50"] > 0.0
    assert "prop_steps" in printed
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_bad_input_cleanly(
    sample_path: Path, tiny_tokenizer_dir: Path, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    def replay(trace: Path, *opts: str) -> int:
        common = ["--tokenizer", str(tiny_tokenizer_dir), "--cache-dir", str(tmp_path / "c")]
        return main(["replay", "--traces", str(trace), *common, "--no-progress", *opts])

    bad = tmp_path / "bad.jsonl"
    bad.write_text(sample_path.read_text().splitlines()[0] + "\n{oops\n")
    assert replay(bad, "--proposers", "none") == 2
    assert f"{bad}:2: malformed trace record" in capsys.readouterr().err
    assert replay(sample_path, "--proposers", "none,nosuch") == 2
    assert "nosuch" in capsys.readouterr().err
    assert replay(sample_path, "--run-order", "backwards") == 2
    assert "'file', 'reversed' or 'shuffle:SEED'" in capsys.readouterr().err


def test_order_runs_moves_whole_runs() -> None:
    def call(run: str, i: int) -> ReplayCall:
        ids = np.array([i], np.int32)
        return ReplayCall(req_id=f"{run}#{i}", run_id=run, prompt=ids, output=ids)

    def ids(cs: Sequence[ReplayCall]) -> list[str]:
        return [c.req_id for c in cs]

    calls = [call("a", 0), call("b", 0), call("a", 1), call("c", 0), call("b", 1)]
    assert ids(order_runs(calls, "file")) == ids(calls)
    assert ids(order_runs(calls, "reversed")) == ["c#0", "b#0", "b#1", "a#0", "a#1"]
    shuffled = [ids(order_runs(calls, f"shuffle:{seed}")) for seed in range(8)]
    assert shuffled[0] == ids(order_runs(calls, "shuffle:0"))  # seeded
    assert len({tuple(s) for s in shuffled}) > 1
    for got in shuffled:  # a permutation of whole runs, each run's calls in order
        assert sorted(got) == sorted(ids(calls))
        for run in "abc":
            mine = [r for r in got if r.startswith(run)]
            assert mine == sorted(mine)
            first = got.index(mine[0])
            assert got[first : first + len(mine)] == mine
    for bad in ("shuffle", "shuffle:x", "random"):
        with pytest.raises(ValueError, match="run_order"):
            order_runs(calls, bad)
        with pytest.raises(ValueError, match="run_order"):
            ReplayConfig(traces=["t"], tokenizer="tok", run_order=bad)


def test_a_run_id_in_two_trace_files_is_one_run_and_warned(tiny_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import warnings

    from tests.conftest import SAMPLE

    tr = tokenize_trace(SAMPLE, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    later = tmp_path / "later.jsonl"  # the runs' later calls, recorded in another file
    records = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    later.write_text(
        "".join(json.dumps({**r, "call_index": r["call_index"] + 100}) + "\n" for r in records)
    )
    tr2 = tokenize_trace(later, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one file: nothing to say
        one = build_calls([tr])
    with pytest.warns(UserWarning, match=r"run id\(s\) are in more than one trace file"):
        two = build_calls([tr, tr2])
    for wl, calls in one.items():  # each run twice as long, still one run per id
        assert len(two[wl]) == 2 * len(calls)
        assert {c.run_id for c in two[wl]} == {c.run_id for c in calls}


def test_build_calls_subsets(sample_calls, tiny_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import SAMPLE

    tr = tokenize_trace(SAMPLE, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    one = build_calls([tr], max_calls_per_run=1)
    assert len(one["sample_tool_agent"]) == 3 and len(one["sample_react"]) == 2
    assert len(build_calls([tr], max_calls=2)["sample_tool_agent"]) == 2
    whole = build_calls([tr])
    first = build_calls([tr], max_runs=1)
    for wl, calls in first.items():  # the first run of each workload, all its calls
        run = whole[wl][0].run_id
        assert [c.req_id for c in calls] == [c.req_id for c in whole[wl] if c.run_id == run]
    assert len({c.run_id for c in whole["sample_tool_agent"]}) > 1  # so the cut is real
    tagged = build_calls([tr])["sample_tool_agent"][0].tags
    assert tagged is not None and tagged.agent_id == "travel_agent" and tagged.segment is None
    assert build_calls([tr], tags="none")["sample_react"][0].tags is None


def test_run_ids_are_a_workloads_own(tiny_tokenizer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two workloads that number their runs alike keep their own runs: a per-run subset
    of the second once counted the first's calls (and lost its own)."""
    import json

    from tests.conftest import SAMPLE

    path = tmp_path / "alike.jsonl"
    with open(SAMPLE) as src, open(path, "w") as dst:
        for line in src:
            rec = json.loads(line)
            rec["run_id"] = rec["run_id"].replace("react-", "tool-")
            dst.write(json.dumps(rec) + "\n")
    tr = tokenize_trace(path, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    by_wl = build_calls([tr], max_calls_per_run=2)
    assert len(by_wl["sample_tool_agent"]) == 6 and len(by_wl["sample_react"]) == 4


def test_the_ngram_kernel_compiles_before_the_first_timed_propose() -> None:
    """vLLM's n-gram kernel is jit-compiled without a disk cache: the peer compiles it
    when built (as vLLM's NgramProposer does), not inside its first timed ``propose``
    (0.4-0.8 s there cut the peer's speedup with proposer time). A fresh process, so an
    earlier test's compilation cannot hide it."""
    import subprocess
    import sys

    code = (
        "from agentspec_mw.peers.ngram import NgramProposer; "
        "print(len(NgramProposer()._kernel.signatures))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.split()[-1]) >= 1
