"""The default model is converted once, also when several processes ask for it at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agentspec_mw import default_model


def test_concurrent_first_uses_convert_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf")
    monkeypatch.setattr(default_model, "_gguf_path", lambda: gguf)
    calls: list[Path] = []

    def slow_convert(_gguf: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)  # long enough for every other caller to arrive meanwhile
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(default_model, "_convert", slow_convert)
    cache = tmp_path / "cache"
    got: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: got.append(default_model.default_model_dir(cache, quiet=True))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # one conversion; the other three waited and read its folder
    assert len(set(got)) == 1 and (got[0] / "config.json").is_file()
    assert [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")] == [
        got[0].name
    ]  # no temporary folder left behind
