"""The stored calibration prior: the shipped file, its checks, and how it is fitted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from agentspec_mw.agentspec.calibration import (
    cell_shape,
    load_prior,
    prior_table,
    stored_prior,
)
from agentspec_mw.costmodel import get_cost_model
from agentspec_mw.errors import AgentSpecError
from agentspec_mw.proposer import ProposerEnv
from agentspec_mw.registry import make_proposer
from tests.helpers import react_calls, script

ENV = ProposerEnv(token_bytes=[bytes([t]) for t in range(256)], max_k=8)


def test_the_shipped_prior_fits_the_layout_and_names_its_traces() -> None:
    prior, meta = stored_prior()
    assert prior.shape == (math.prod(cell_shape()),)
    assert np.all((prior >= 0) & (prior <= 1)) and not prior.flags.writeable
    assert meta["traces"] and meta["command"].startswith("python benchmarks/fit_calibration_prior")
    # it differs from the redundancy prior only where the traces reached a cell
    assert np.count_nonzero(prior != prior_table(0.5, 0.9)) > 100


def test_the_proposer_starts_from_the_stored_prior_by_default() -> None:
    stored = make_proposer("agentspec", ENV)
    assert np.array_equal(stored._calib.prior, stored_prior()[0])
    assert stored._calib.prior.flags.writeable  # a copy: the kernels take writable arrays
    assert np.array_equal(stored._scopes.table[1], stored_prior()[0])
    old = make_proposer("agentspec", ENV, experimental={"calib_prior": "redundancy"})
    assert np.array_equal(old._calib.prior, prior_table(0.5, 0.9))


def _write(path: Path, prior: np.ndarray, shape: tuple[int, ...]) -> Path:
    np.savez(path, prior=prior, shape=np.array(shape), meta=np.array(json.dumps({})))
    return path


def test_a_bad_prior_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    n = math.prod(cell_shape())
    good = _write(tmp_path / "good.npz", np.full(n, 0.5), cell_shape())
    assert load_prior(good)[0].shape == (n,)
    with pytest.raises(AgentSpecError, match="cannot be read"):
        load_prior(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a numpy file")
    with pytest.raises(AgentSpecError, match="cannot be read"):
        load_prior(tmp_path / "junk.npz")
    other = (*cell_shape()[:-1], cell_shape()[-1] + 1)
    with pytest.raises(AgentSpecError, match="refit it"):
        load_prior(_write(tmp_path / "layout.npz", np.full(math.prod(other), 0.5), other))
    with pytest.raises(AgentSpecError, match=r"outside \[0, 1\]"):
        load_prior(_write(tmp_path / "range.npz", np.full(n, 1.5), cell_shape()))


def test_the_fit_shrinks_the_counts_toward_the_redundancy_prior() -> None:
    fit = script("fit_calibration_prior")
    calls, cost = react_calls(8, grow=5), get_cost_model("llama8b-h100")
    succ, tot = fit.count_cells(calls, ENV, cost, batch=2, k=8)
    assert tot.sum() > 0 and np.all(succ <= tot)
    prior, strength = fit.prior_from_counts(succ, tot)
    base = prior_table(0.5, 0.9)
    assert strength == 8.0
    assert np.allclose(prior, (succ + 8.0 * base) / (tot + 8.0))
    assert np.array_equal(prior[tot == 0], base[tot == 0])  # unreached cells keep g
    # the counts are the proposer's own, from the redundancy prior: a replay reproduces them
    again = fit.count_cells(calls, ENV, cost, batch=2, k=8)
    assert np.array_equal(again[0], succ) and np.array_equal(again[1], tot)


def test_fit_and_cold_calibration_scripts_run_on_the_sample(
    sample_path: Path,
    tiny_tokenizer_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE", str(tmp_path / "cache"))
    traces = ["--traces", str(sample_path), "--tokenizer", str(tiny_tokenizer_dir)]
    out = tmp_path / "prior.npz"
    fit = script("fit_calibration_prior")
    assert fit.main([*traces, "--batch", "2", "--k", "4", "--out", str(out)]) == 0
    prior, meta = load_prior(out)  # the file the proposer would read
    assert meta["traces"] == [sample_path.name] and meta["batch"] == 2
    assert "fit_calibration_prior.py" in meta["command"]
    assert np.count_nonzero(prior != prior_table(0.5, 0.9)) > 0
    cold = script("cold_calibration")
    assert cold.main([*traces, "--max-calls", "6", "--batch", "1", "--k", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines if ln.startswith(sample_path.name[:32])]
    assert rows and [r[1] for r in rows] == ["stored", "redundancy"] * (len(rows) // 2)
    assert all(float(r[2]) >= float(r[4]) for r in rows)  # drafted >= accepted
