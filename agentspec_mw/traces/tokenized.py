"""Tokenized traces, cached on disk by content hash.

Tokenizing the shared traces naively takes ~15 minutes; the cache makes a second replay
skip it. The key is ``sha256(trace file bytes)`` + a fingerprint of the tokenizer
(vocabulary, merges, chat template) + :data:`RENDER_VERSION` + :data:`CACHE_VERSION`. An
entry is a folder with ``calls.json`` (per-call metadata), ``steps.json`` and
``times.json`` (each call's ``meta.step`` and ``[meta.started, meta.ended]``),
``load.json`` (the loader's counts: records, skipped malformed ones and their first
messages, which a cache hit reports again), ``tokens.bin`` (int32, prompt then output per
call) and ``offsets.npy``; an entry lacking ``steps.json``, ``times.json`` or
``load.json`` (an older one) gets them from the trace file, without tokenizing again. It
is written to a temporary folder and renamed into place, so an interrupted run never
leaves a half entry. Tokens are memory-mapped, not loaded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from agentspec_mw.errors import MissingDependencyError, ModelNotFoundError
from agentspec_mw.traces.loader import MAX_ERRORS, LoadStats, iter_records
from agentspec_mw.traces.render import RENDER_VERSION, render_prompt_text
from agentspec_mw.traces.schema import TraceRecord

__all__ = [
    "CACHE_VERSION",
    "CallMeta",
    "TokenizedTrace",
    "call_meta",
    "default_cache_dir",
    "load_tokenizer",
    "tokenize_trace",
    "tokenizer_fingerprint",
]

_CHUNK = 128

#: Bump when what the loader accepts or what an entry holds changes: it is part of the
#: cache key, so older entries are not used (3: ``load.json``; records the loader now
#: rejects — a repeated call, a lone surrogate, malformed ``tool_calls``, an over-long id).
CACHE_VERSION = 3


def default_cache_dir() -> Path:
    """``$AGENTSPEC_CACHE`` or ``$XDG_CACHE_HOME/agentspec_mw`` (``~/.cache/agentspec_mw``)."""
    env = os.environ.get("AGENTSPEC_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentspec_mw"


def load_tokenizer(name_or_path: str) -> Any:
    """Load a Hugging Face tokenizer (offline paths work; no hub access is needed).

    ``"default"`` is the embedded default model's tokenizer (see ``agentspec_mw.default_model``).

    Raises:
        ModelNotFoundError: ``name_or_path`` is no tokenizer that can be loaded here.
    """
    if name_or_path == "default":
        from agentspec_mw.default_model import default_model_dir

        name_or_path = str(default_model_dir())
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MissingDependencyError(
            "transformers", "tokenizing traces", "pip install 'agentspec-mw[tokenizers]'"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    # no such folder or id; a folder without one; a tokenizer.json the tokenizers library
    # cannot read (it raises a bare Exception)
    except Exception as exc:  # noqa: BLE001
        reason = " ".join(str(exc).split())[:240] or type(exc).__name__
        raise ModelNotFoundError(
            f"tokenizer {name_or_path!r} cannot be loaded ({reason}): pass a local tokenizer "
            "folder (with tokenizer.json or tokenizer_config.json), a Hugging Face model id "
            "already in the local cache (or reachable, without HF_HUB_OFFLINE), or `default` "
            "for the embedded default model's tokenizer"
        ) from None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable hash of what decides token ids: vocabulary/merges, template, render version."""
    h = hashlib.sha256(f"render-v{RENDER_VERSION}".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(str(getattr(tokenizer, "chat_template", None)).encode())
    return h.hexdigest()[:16]


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class CallMeta:
    """Per-call metadata kept with the tokens (everything but the text)."""

    workload: str
    run_id: str
    call_index: int
    agent: str
    segment_hint: str
    parent_group: str | None
    step: int | None = None
    """``meta.step`` of the record where it is an integer: the step of its run the call was
    issued at (a LangGraph superstep, a ToT search step); calls of one run and redundancy
    group issued at the same step were issued together
    (:func:`agentspec_mw.replay.run.issued_together`)."""
    started: float | None = None
    """``meta.started`` of the record (wall-clock seconds), where it and ``meta.ended``
    are finite numbers in order: a call that started after the one before it ended was not
    issued with it, whatever its group and step."""
    ended: float | None = None
    """``meta.ended`` of the record, with ``started``."""


def _step_of(rec: TraceRecord) -> int | None:
    step = rec.meta.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _times_of(rec: TraceRecord) -> list[float] | None:
    """``[meta.started, meta.ended]`` where both are finite numbers, started first."""
    times = [rec.meta.get("started"), rec.meta.get("ended")]
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in times):
        return None
    start, end = float(times[0]), float(times[1])  # type: ignore[arg-type]
    return [start, end] if math.isfinite(start) and math.isfinite(end) and start <= end else None


class TokenizedTrace:
    """The calls of one trace file as token ids (memory-mapped)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        raw = json.loads((folder / "calls.json").read_text())
        self.source = raw["source"]
        n = len(raw["calls"])
        steps = _read_list(folder / "steps.json", n)
        times = _read_list(folder / "times.json", n)
        self.calls = [
            CallMeta(w, run, i, agent, segment, group, step, *(span or (None, None)))
            for (w, run, i, agent, segment, group), step, span in zip(
                raw["calls"], steps, times, strict=True
            )
        ]
        self.prompt_lens = np.asarray(raw["prompt_lens"], dtype=np.int64)
        self.offsets = np.load(folder / "offsets.npy")
        size = int(self.offsets[-1]) if len(self.offsets) else 0
        # a plain (read-only) ndarray view of the mapping: a slice of a np.memmap is a
        # memmap, ~1.4 µs to make against ~0.1 µs, and slower for proposers to take in
        self.tokens = (
            np.memmap(folder / "tokens.bin", dtype=np.int32, mode="r", shape=(size,)).view(
                np.ndarray
            )
            if size
            else np.zeros(0, dtype=np.int32)
        )

    def __len__(self) -> int:
        return len(self.calls)

    def prompt(self, i: int) -> np.ndarray:
        """Prompt token ids of call ``i`` (a read-only view)."""
        start = int(self.offsets[i])
        return self.tokens[start : start + int(self.prompt_lens[i])]

    def output(self, i: int) -> np.ndarray:
        """Output token ids of call ``i`` (a read-only view)."""
        start = int(self.offsets[i]) + int(self.prompt_lens[i])
        return self.tokens[start : int(self.offsets[i + 1])]


def _encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def call_meta(rec: TraceRecord) -> CallMeta:
    """The metadata the replay keeps of a record (what a cache entry stores of it)."""
    span = _times_of(rec) or (None, None)
    return CallMeta(
        rec.workload, rec.run_id, rec.call_index, rec.agent, rec.segment_hint,
        rec.parent_group, _step_of(rec), *span,
    )  # fmt: skip


def _read_list(path: Path, n: int) -> list[Any]:
    """A per-call list an entry keeps beside ``calls.json`` (``None`` each where it lacks
    one of ``n`` items)."""
    values = json.loads(path.read_text()) if path.is_file() else None
    return values if isinstance(values, list) and len(values) == n else [None] * n


def _write_entry(
    records: Iterator[TraceRecord], tokenizer: Any, out: Path, source: str, progress: bool
) -> None:
    calls: list[list[Any]] = []
    steps: list[int | None] = []
    times: list[list[float] | None] = []
    prompt_lens: list[int] = []
    offsets = [0]
    with (
        (out / "tokens.bin").open("wb") as fh,
        tqdm(desc=f"tokenizing {Path(source).name}", unit=" calls", disable=not progress) as bar,
    ):
        chunk: list[TraceRecord] = []

        def flush() -> None:
            prompts = _encode(tokenizer, [render_prompt_text(r.prompt, tokenizer) for r in chunk])
            outputs = _encode(tokenizer, [r.output for r in chunk])
            for rec, p_ids, o_ids in zip(chunk, prompts, outputs, strict=True):
                arr = np.asarray(p_ids + o_ids, dtype=np.int32)
                fh.write(arr.tobytes())
                offsets.append(offsets[-1] + len(arr))
                prompt_lens.append(len(p_ids))
                calls.append(
                    [
                        rec.workload,
                        rec.run_id,
                        rec.call_index,
                        rec.agent,
                        rec.segment_hint,
                        rec.parent_group,
                    ]
                )
                steps.append(_step_of(rec))
                times.append(_times_of(rec))
            bar.update(len(chunk))
            chunk.clear()

        for rec in records:
            chunk.append(rec)
            if len(chunk) >= _CHUNK:
                flush()
        if chunk:
            flush()
    np.save(out / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    (out / "steps.json").write_text(json.dumps(steps))
    (out / "times.json").write_text(json.dumps(times))
    (out / "calls.json").write_text(
        json.dumps({"source": source, "calls": calls, "prompt_lens": prompt_lens})
    )


def _load_json(path: Path, stats: LoadStats) -> dict[str, Any]:
    """``stats`` as kept in ``load.json``: its messages without the trace path (the same
    content may be read from another path later)."""
    prefix = f"{path}:"
    return {
        "records": stats.records,
        "skipped": stats.skipped,
        "errors": [e.removeprefix(prefix) for e in stats.errors],
    }


def _read_load(entry: Path, path: Path) -> LoadStats | None:
    """The loader's counts kept in ``entry`` (messages naming ``path``), or ``None``."""
    try:
        raw = json.loads((entry / "load.json").read_text())
        return LoadStats(
            int(raw["records"]), int(raw["skipped"]), [f"{path}:{e}" for e in raw["errors"]]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _add_missing(entry: Path, path: Path, skip_malformed: bool) -> LoadStats:
    """Write ``steps.json``, ``times.json`` and ``load.json`` into a cache entry lacking
    them, from the trace file (no tokenizing); return the loader's counts. A cache that
    cannot be written to keeps the entry as it is, with a warning: without steps its calls
    have none (only the samples of one request are issued together), without times none."""
    stats = LoadStats()
    steps: list[int | None] = []
    times: list[list[float] | None] = []
    for rec in iter_records(path, skip_malformed=skip_malformed, stats=stats):
        steps.append(_step_of(rec))
        times.append(_times_of(rec))
    missing = {
        "steps.json": ("the calls' steps", steps),
        "times.json": ("the calls' times", times),
        "load.json": ("the load counts", _load_json(path, stats)),
    }
    for name, (what, value) in missing.items():
        if (entry / name).is_file():
            continue
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=entry)
            with os.fdopen(fd, "w") as fh:
                json.dump(value, fh)
            os.replace(tmp, entry / name)
        except OSError as exc:
            warnings.warn(
                f"{entry}: could not add {what} to this cache entry ({exc}); "
                "delete the entry to tokenize the trace again",
                stacklevel=3,
            )
    return stats


def tokenize_trace(
    path: str | Path,
    tokenizer: Any,
    *,
    cache_dir: Path | None = None,
    skip_malformed: bool = False,
    stats: LoadStats | None = None,
    progress: bool = True,
) -> TokenizedTrace:
    """Tokenize one trace file, or load it from the cache when its content was seen;
    ``stats`` gets the loader's counts either way."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    fingerprint = tokenizer_fingerprint(tokenizer)
    key = f"{_file_hash(p)}-{fingerprint}-c{CACHE_VERSION}-{'s' if skip_malformed else 'x'}"
    entry = cache / "tokens" / key
    if (entry / "calls.json").is_file():
        loaded = _read_load(entry, p)
        if loaded is None or not all((entry / f).is_file() for f in ("steps.json", "times.json")):
            loaded = _add_missing(entry, p, skip_malformed)
        _add_counts(stats, loaded)
        return TokenizedTrace(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=entry.parent))
    own = LoadStats()
    try:
        recs = iter_records(p, skip_malformed=skip_malformed, stats=own)
        _write_entry(recs, tokenizer, tmp, str(p), progress)
        (tmp / "load.json").write_text(json.dumps(_load_json(p, own)))
        try:
            tmp.rename(entry)
        except OSError:  # another process won the race: use its entry
            if not (entry / "calls.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _add_counts(stats, own)
    return TokenizedTrace(entry)


def _add_counts(stats: LoadStats | None, add: LoadStats) -> None:
    """Add ``add``'s counts to the caller's ``stats`` (where given), as the loader would."""
    if stats is None:
        return
    stats.records += add.records
    stats.skipped += add.skipped
    stats.errors.extend(add.errors[: max(0, MAX_ERRORS - len(stats.errors))])
