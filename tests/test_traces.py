"""Trace schema, streaming loaders, rendering and the token cache."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from agentspec_mw.errors import TraceFormatError
from agentspec_mw.traces import LoadStats, iter_records
from agentspec_mw.traces.render import fallback_render, render_prompt_text
from agentspec_mw.traces.schema import Message
from agentspec_mw.traces.tokenized import tokenize_trace


def test_loads_sample_in_file_order(sample_path: Path) -> None:
    recs = list(iter_records(sample_path))
    assert len(recs) == 18
    assert [r.call_index for r in recs[:4]] == [0, 1, 2, 3]
    assert recs[0].workload == "sample_tool_agent"
    assert isinstance(recs[-1].prompt, str)


@pytest.mark.parametrize("suffix,opener", [(".jsonl.xz", lzma.open), (".jsonl.gz", gzip.open)])
def test_compressed_files_stream(sample_path: Path, tmp_path: Path, suffix: str, opener) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / f"sample{suffix}"
    with opener(out, "wt", encoding="utf-8") as fh:
        fh.write(sample_path.read_text())
    assert [r.output for r in iter_records(out)] == [r.output for r in iter_records(sample_path)]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_malformed_record_names_file_and_line(sample_path: Path, tmp_path: Path) -> None:
    good = sample_path.read_text().splitlines()
    bad = json.loads(good[1])
    del bad["output"]
    p = _write(tmp_path, [good[0], json.dumps(bad), "{not json", good[2]])
    with pytest.raises(TraceFormatError) as err:
        list(iter_records(p))
    assert err.value.line == 2 and str(p) in str(err.value) and "output" in str(err.value)


def test_skip_malformed_counts(sample_path: Path, tmp_path: Path) -> None:
    good = sample_path.read_text().splitlines()
    p = _write(tmp_path, [good[0], "{not json", "[1, 2]", good[2], '{"workload": "x"}'])
    stats = LoadStats()
    recs = list(iter_records(p, skip_malformed=True, stats=stats))
    assert len(recs) == 2 and stats.records == 2 and stats.skipped == 3
    assert any(":2:" in e and "invalid JSON" in e for e in stats.errors)


def test_negative_call_index_rejected(sample_path: Path, tmp_path: Path) -> None:
    rec = json.loads(sample_path.read_text().splitlines()[0])
    rec["call_index"] = -1
    with pytest.raises(TraceFormatError, match="call_index"):
        list(iter_records(_write(tmp_path, [json.dumps(rec)])))


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(ValueError, match="unknown trace file type"):
        list(iter_records(tmp_path / "x.csv"))
    with pytest.raises(FileNotFoundError):
        list(iter_records(tmp_path / "nope.jsonl"))


def test_tool_calls_fold_into_content_when_template_ignores_them(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    msgs = [
        Message(role="user", content="hi"),
        Message.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}],
            }
        ),
        Message(role="tool", content="ok"),
    ]
    text = render_prompt_text(msgs, tiny_tokenizer)
    assert '{"name": "f", "arguments": {"a":1}}' in text
    assert text.endswith("<|im_start|>assistant\n")
    fb = fallback_render([m.model_dump(exclude_none=True) for m in msgs])
    assert fb.startswith("<|user|>\nhi\n") and '{"name": "f"' in fb
    assert render_prompt_text("plain prompt", tiny_tokenizer) == "plain prompt"


def test_token_cache_skips_tokenization(sample_path: Path, tiny_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = tokenize_trace(sample_path, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    assert len(first) == 18
    assert tiny_tokenizer.decode(first.output(0)) == next(iter_records(sample_path)).output

    class Exploding:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            if name in ("backend_tokenizer", "chat_template"):
                return getattr(tiny_tokenizer, name)
            raise AssertionError(f"tokenizer.{name} used on a cache hit")

        def __call__(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError("tokenized again on a cache hit")

    second = tokenize_trace(sample_path, Exploding(), cache_dir=tmp_path, progress=False)
    assert second.folder == first.folder
    assert (second.output(3) == first.output(3)).all()
    # read-only views of the mapped cache, as plain arrays (a memmap slice is a memmap,
    # ~14x slower to make on the replay's per-token path)
    for view in (second.prompt(3), second.output(3)):
        assert type(view) is np.ndarray and not view.flags.writeable


def test_each_calls_step_is_kept_and_added_to_an_older_cache_entry(
    tiny_tokenizer,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    from agentspec_mw.replay.run import build_calls

    def rec(i: int, group: str | None, step: object, prompt: str) -> dict[str, object]:
        return {
            "workload": "w",
            "run_id": "r",
            "call_index": i,
            "agent": "a",
            "parent_group": group,
            "prompt": prompt,
            "output": f"out {i}",
            "meta": {} if step is None else {"step": step},
        }

    rows = [
        rec(0, None, 1, "plan"),
        rec(1, "g", 2, "field one"),  # a fan-out of two at step 2
        rec(2, "g", 2, "field two"),
        rec(3, "s", None, "same"),  # two samples of one request
        rec(4, "s", None, "same"),
        rec(5, "s", "x", "same"),  # a step that is not an integer counts as none
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache"
    tr = tokenize_trace(path, tiny_tokenizer, cache_dir=cache, progress=False)
    assert [c.step for c in tr.calls] == [1, 2, 2, None, None, None]
    together = [c.with_previous for c in build_calls([tr])["w"]]
    assert together == [False, False, True, False, True, True]
    assert not any(c.with_previous for c in build_calls([tr], serial_runs=True)["w"])
    # an entry written before steps were kept: they are read from the trace, not tokenized
    (tr.folder / "steps.json").unlink()

    class NoTokenizing:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(tiny_tokenizer, name)

        def __call__(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError("tokenized again on a cache hit")

    again = tokenize_trace(path, NoTokenizing(), cache_dir=cache, progress=False)
    assert again.folder == tr.folder
    assert [c.step for c in again.calls] == [1, 2, 2, None, None, None]


def test_times_tell_calls_that_ran_one_after_another_and_reach_an_older_entry(
    tiny_tokenizer,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """A call of a fan-out's group and step that started after the call before it ended
    (a later round, a call re-made after an interrupt) is not issued with it; records
    without usable times keep the group-and-step rule."""
    from agentspec_mw.replay.run import build_calls

    def rec(i: int, times: object) -> dict[str, object]:
        meta: dict[str, object] = {"step": 2}
        if times is not None:
            meta["started"], meta["ended"] = times  # type: ignore[misc]
        return {
            "workload": "w",
            "run_id": "r",
            "call_index": i,
            "agent": "a",
            "parent_group": "g",
            "prompt": f"field {i}",
            "output": f"out {i}",
            "meta": meta,
        }

    rows = [
        rec(0, (10.0, 12.0)),
        rec(1, (10.5, 11.0)),  # overlapped call 0: together
        rec(2, (11.5, 13.0)),  # started after call 1 ended: not together
        rec(3, (True, 14.0)),  # not times: the rule without them (same group and step)
        rec(4, (15.0, float("inf"))),  # not finite: none
        rec(5, (17.0, 16.0)),  # ended before it started: none
        rec(6, None),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache"
    tr = tokenize_trace(path, tiny_tokenizer, cache_dir=cache, progress=False)
    spans = [(c.started, c.ended) for c in tr.calls]
    assert spans == [(10.0, 12.0), (10.5, 11.0), (11.5, 13.0)] + [(None, None)] * 4
    together = [c.with_previous for c in build_calls([tr])["w"]]
    assert together == [False, True, False, True, True, True, True]
    (tr.folder / "times.json").unlink()  # an entry written before times were kept
    again = tokenize_trace(path, tiny_tokenizer, cache_dir=cache, progress=False)
    assert [(c.started, c.ended) for c in again.calls] == spans


def test_a_cache_entry_that_cannot_take_steps_still_loads(
    sample_path: Path,
    tiny_tokenizer,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tempfile

    first = tokenize_trace(sample_path, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    (first.folder / "steps.json").unlink()

    def read_only(*a: object, **k: object) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)  # a cache that cannot be written to
    with pytest.warns(UserWarning, match="could not add the calls' steps"):
        again = tokenize_trace(sample_path, tiny_tokenizer, cache_dir=tmp_path, progress=False)
    assert len(again) == len(first) and all(c.step is None for c in again.calls)
    assert not (first.folder / "steps.json").exists()
