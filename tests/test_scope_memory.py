"""The memory figure the docs give per learned state (a scope's, per decoding regime) is
the code's."""

from __future__ import annotations

import inspect
import re

from agentspec_mw.agentspec import config
from agentspec_mw.agentspec.calibration import Calibration


def test_documented_bytes_per_scope_match_the_arrays() -> None:
    calib = Calibration(
        [bytes([i]) for i in range(256)],
        g_min=0.3,
        prior_scale=1.0,
        prior_strength=4.0,
        max_scopes=2,
    )
    s = calib.scopes
    arrays = (s.succ, s.tot, s.table, s.fsucc, s.ftot, s.ledger)
    per_row_mb = sum(a.nbytes / a.shape[0] for a in arrays) / 1e6
    doc = inspect.getsource(config).split("calib_max_scopes: int")[1]
    found = re.search(r"About ([0-9.]+) MB each", doc)
    assert found is not None, doc
    assert abs(float(found.group(1)) - per_row_mb) < 0.05, per_row_mb
