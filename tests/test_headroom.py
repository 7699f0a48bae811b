"""``benchmarks/headroom.py``: the step decomposition adds up, the oracle is a ceiling."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.peers.none import NoProposer
from agentspec_mw.proposer import Draft, StepContext
from agentspec_mw.replay import sim
from agentspec_mw.replay.sim import ReplayCall
from agentspec_mw.traces.tokenized import CallMeta
from tests.helpers import Wrong, script


def _calls(n_runs: int = 3, per_run: int = 2) -> list[ReplayCall]:
    out = []
    for r in range(n_runs):
        for i in range(per_run):
            out.append(
                ReplayCall(
                    req_id=f"r{r}#{i}",
                    run_id=f"run{r}",
                    prompt=np.arange(40 + 10 * i, dtype=np.int32) + 1000 * (per_run * r + i),
                    output=np.arange(100, 100 + 20 + 5 * r, dtype=np.int32),
                )
            )
    return out


@pytest.mark.parametrize("preset", ["llama8b-h100", "llama8b-h100-roofline", "cpu-smollm2"])
def test_steps_add_up_and_the_oracle_is_never_rejected(preset: str) -> None:
    hr = script("headroom")
    cost = get_cost_model(preset)
    calls = _calls()
    original = sim._schedule
    none = hr.replay_one("none", calls, None, cost, 2, 8, "w")
    best = hr.replay_one(hr.ORACLE, calls, None, cost, 2, 8, "w")
    assert sim._schedule is original  # the wrapper is removed after each run
    for run in (none, best):
        assert run.prefill_step_time_s + run.decode_step_time_s == pytest.approx(run.time_s)
        assert run.prefill_tokens == sum(len(c.prompt) for c in calls)  # no prefix shared
        assert run.call_steps == run.decode_tokens + len(calls)  # + one prefill completion each
        if run.terms_s is not None:
            assert sum(run.terms_s.values()) == pytest.approx(run.time_s)
    assert none.draft_tokens == none.accepted == 0
    assert best.draft_tokens == best.accepted > 0  # every drafted token accepted
    assert best.time_s < none.time_s
    gap = hr.gap(none, best)
    assert sum(v for t, v in gap.items() if t != "total") == pytest.approx(gap["total"])
    assert gap["total"] == pytest.approx(100 * (1 - best.time_s / none.time_s))


def test_end_to_end_on_the_sample(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE", str(tmp_path / "cache"))
    hr = script("headroom")
    out = tmp_path / "h.json"
    argv = ["--traces", str(sample_path), "--tokenizer", str(tiny_tokenizer_dir)]
    argv += ["--proposers", "ngram,best:ngram+none,shadow:none+ngram,trim:ngram"]
    argv += ["--batch", "1,4", "--k", "4"]
    argv += ["--json", str(out)]
    assert hr.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| 4 | **geomean** |" in printed and "oracle/ngram" not in printed
    runs = json.loads(out.read_text())["runs"]
    names = {"none", "ngram", "best:ngram+none", "shadow:none+ngram", "trim:ngram", "oracle"}
    assert {r["proposer"] for r in runs} == names
    shadowed = [r for r in runs if r["proposer"] == "shadow:none+ngram"]
    assert all(r["draft_tokens"] == 0 and r["parts_accepted"]["none"] == 0 for r in shadowed)
    for r in runs:
        assert r["prefill_step_time_s"] + r["decode_step_time_s"] == pytest.approx(r["time_s"])
        base = next(
            x
            for x in runs
            if x["proposer"] == "none"
            and x["workload"] == r["workload"]
            and x["batch"] == r["batch"]
        )
        assert r["speedup"] == pytest.approx(base["time_s"] / r["time_s"])
        if r["proposer"] in ("oracle", "trim:ngram"):
            assert r["speedup"] >= 1.0 and r["draft_tokens"] == r["accepted"]
        assert not math.isnan(r["speedup"])
    assert hr.main(["--merge", str(out), str(out)]) == 0  # the tables again, from the file
    assert "| 4 | **geomean** |" in capsys.readouterr().out


def test_best_of_picks_the_most_accepted_draft_and_the_shorter_on_a_tie() -> None:
    hr = script("headroom")

    class Half(hr.OracleProposer):  # type: ignore[name-defined,misc]
        """Right for 2 tokens, then wrong."""

        name = "half"

        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            return [
                Draft(d.token_ids[:2] + (-1,) * (k - 2)) for d in super().propose(req_ids, k, step)
            ]

    calls = _calls(n_runs=1, per_run=1)
    rid, out = calls[0].req_id, calls[0].output
    step = StepContext(batch_size=1, num_kv_tokens=0)
    right = hr.OracleProposer(calls)
    right.name = "right"
    for parts, want in (
        ([Wrong(), right], tuple(int(t) for t in out[3:7])),
        ([Wrong(), NoProposer()], ()),  # both accepted for 0 tokens: the shorter
    ):
        best = hr.BestOf(parts, calls, "best")
        best.start(rid, calls[0].prompt)
        best.extend(rid, out[:3])
        (d,) = best.propose([rid], 4, step)
        assert d.token_ids == want
        best.stop(rid)
    assert best.name == "best:wrong+none"
    trim = hr.BestOf([Wrong(), Half(calls)], calls, "trim")
    trim.start(rid, calls[0].prompt)
    (d,) = trim.propose([rid], 4, step)
    assert d.token_ids == tuple(int(t) for t in out[:2])  # cut to what is accepted
    shadow = hr.BestOf([Wrong(), hr.OracleProposer(calls)], calls, "shadow")
    shadow.start(rid, calls[0].prompt)
    (d,) = shadow.propose([rid], 4, step)
    assert d.token_ids == (-1,) * 4  # the driver's draft; the shadow is only scored
    assert list(shadow.accepted) == [0, 4] and shadow.slots == 1


def test_calibration_split_labels_and_table(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE", str(tmp_path / "cache"))
    cal = script("calibration")
    meta = [
        CallMeta("w", run, i, "a", seg, group)
        for run, i, seg, group in [
            ("r0", 0, "plan", "g"),
            ("r0", 1, "answer", "g"),
            ("r1", 0, "plan", "g"),  # another run of g: a retry, its sibling r0 seen
            ("r2", 0, "plan", None),
            ("r3", 0, "plan", "f"),  # f stays in one run: a fan-out
            ("r3", 1, "plan", "f"),
        ]
    ]
    assert cal.split_labels(meta, "group_kind") == ["retry"] * 3 + ["none", "fanout", "fanout"]
    assert cal.split_labels(meta, "group_order") == [
        *("first", "first", "later", "none", "first", "later")
    ]
    assert cal.split_labels(meta, "segment")[:2] == ["plan", "answer"]
    argv = ["--traces", str(sample_path), "--tokenizer", str(tiny_tokenizer_dir)]
    argv += ["--batch", "4", "--k", "4", "--holdout", "0", "--split-by", "group_kind"]
    assert cal.main(argv) == 0
    printed = capsys.readouterr().out
    summary = [ln for ln in printed.splitlines() if ln.count(" | ") == 7]  # 8 columns
    labels = {ln.split(" | ")[0].lstrip("| ") for ln in summary}
    assert labels <= {"retry", "none", "split", "---"} and "retry" in labels
    assert "Split-specific error: " in printed
    brier = [ln for ln in printed.splitlines() if ln.startswith("Brier ")]
    assert brier and all("resolution" in ln for ln in brier)
    cells = np.zeros((4, 10, 3))
    cells[0, 1] = (1.5, 0, 10)  # a source that says 0.15 and 0.95 and is right about both
    cells[0, 9] = (9.5, 10, 10)
    (line,) = cal.brier(cells)
    assert "reliability 0.0125" in line and "(100%)" in line


def test_a_tree_of_two_drafts_costs_its_nodes_and_is_accepted_for_the_better_branch() -> None:
    hr = script("headroom")

    class Prefix(hr.OracleProposer):  # type: ignore[name-defined,misc]
        """Right for ``n`` tokens, then one wrong token."""

        def __init__(self, calls: Sequence[ReplayCall], n: int, name: str) -> None:
            super().__init__(calls)
            self.n, self.name = n, name

        def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
            return [Draft(d.token_ids[: self.n] + (-1,)) for d in super().propose(req_ids, k, step)]

    calls = _calls(n_runs=1, per_run=1)
    rid, out = calls[0].req_id, calls[0].output
    step = StepContext(batch_size=1, num_kv_tokens=0)
    for parts, k, want_acc, want_len in (
        # 2 + 4 nodes (1 shared): the right branch is cut to 3 (k = 4), accepted for 3
        ([Prefix(calls, 1, "one"), hr.OracleProposer(calls)], 4, 3, 4),
        # the first branch alone fills k: no room for the second
        ([Wrong(), hr.OracleProposer(calls)], 4, 0, 4),
        # the first branch is the better: 3 nodes, then the second's 5 of its 8 (k = 8)
        ([Prefix(calls, 2, "two"), Wrong()], 8, 2, 8),
    ):
        tree = hr.BestOf(parts, calls, "tree")
        tree.start(rid, calls[0].prompt)
        (d,) = tree.propose([rid], k, step)
        assert len(d.token_ids) == want_len
        assert sim.accepted_length(d.token_ids, out) == want_acc
        assert d.token_ids[:want_acc] == tuple(int(t) for t in out[:want_acc])
