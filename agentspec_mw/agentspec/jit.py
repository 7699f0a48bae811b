"""``kernel``: numba's ``njit(cache=True)`` with a cache that knows the package's other kernels.

numba stamps a cached function with its own file's modification time and size only. A kernel
compiled with a helper from another module inlined or called (``kernels.scan_prompts`` runs
``blocks.feed`` and ``ngram_index.stage_run``) is loaded from the cache unchanged after only
that helper's module changed — after a ``git pull`` that touched ``blocks.py`` alone, the old
automaton would keep running. Here a cached kernel is stamped with one digest of every ``.py``
file in its directory instead (for this package: all the kernels' modules): any change to any
of them recompiles all of them once. Where the cache lives is numba's choice, as for
``cache=True`` (``NUMBA_CACHE_DIR``, else the module's ``__pycache__``, else the user-wide cache
directory).

Not numba's public API: the locator and cache classes subclass ``numba.core.caching``'s (numba ≥
0.60; ``tests/test_jit_cache.py`` checks the behaviour).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from numba import njit
from numba.core import caching
from numba.core.caching import CompileResultCacheImpl, FunctionCache


def _numba_locator(name: str) -> Any:
    """numba's locator class ``name`` (releases before 0.62 spell it with a leading ``_``)."""
    return getattr(caching, name, None) or getattr(caching, f"_{name}")


@cache
def sources_digest(directory: Path) -> str:
    """SHA-256 over the name and bytes of every ``.py`` file in ``directory``, in name order."""
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class _PackageStamp:
    """Locator mixin: the digest of the function's directory's sources as its stamp."""

    _py_file: str

    def get_source_stamp(self) -> str:
        return sources_digest(Path(self._py_file).resolve().parent)


class _UserProvided(_PackageStamp, _numba_locator("UserProvidedCacheLocator")):  # type: ignore[misc]
    pass


class _InTree(_PackageStamp, _numba_locator("InTreeCacheLocator")):  # type: ignore[misc]
    pass


class _UserWide(_PackageStamp, _numba_locator("UserWideCacheLocator")):  # type: ignore[misc]
    pass


class _Impl(CompileResultCacheImpl):
    # numba's own order: NUMBA_CACHE_DIR, then __pycache__, then the user-wide directory.
    _locator_classes = [_UserProvided, _InTree, _UserWide]


class _Cache(FunctionCache):
    _impl_class = _Impl


def kernel(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``njit(**options)`` cached under its directory's sources digest (module docstring)."""

    def compile_cached(func: Callable[..., Any]) -> Any:
        dispatcher = njit(**options)(func)
        dispatcher._cache = _Cache(dispatcher.py_func)
        return dispatcher

    return compile_cached
