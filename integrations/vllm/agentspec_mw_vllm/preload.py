"""The libraries vLLM's CPU backend wants preloaded: tcmalloc and Intel OpenMP.

vLLM's CPU installation guide ("set LD_PRELOAD") asks for ``libtcmalloc_minimal.so.4``
(Debian/Ubuntu package ``libtcmalloc-minimal4``) and, on x86, Intel OpenMP's
``libiomp5.so`` (PyPI package ``intel-openmp``, which installs it into the environment's
``lib/``) in ``LD_PRELOAD``; without them its CPU worker warns, and for speculative
decoding that the missing Intel OpenMP "will cause significant performance loss".

``LD_PRELOAD`` only acts when a process starts, so it cannot be set from inside the
engine's own process: launchers put :func:`preload_env`'s value in the environment of
the process they start (``agentspec serve``'s server process, ``agentspec bench``'s engine
processes; a shell through ``python -m agentspec_mw_vllm.preload``).
``AGENTSPEC_PRELOAD=0`` (or ``false``, ``no``, ``off``) turns it off; ``1``, ``true``,
``yes``, ``on`` or unset leave it on, and any other value is an error
(:func:`preload_enabled`). Libraries that are not installed are skipped, and so (with a
warning) is one whose path holds a space or a colon: ``LD_PRELOAD`` splits at both.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import sys
import warnings
from collections.abc import Mapping

__all__ = [
    "PRELOAD_ENV",
    "find_preload_libs",
    "preload_enabled",
    "preload_env",
    "with_preload",
    "without_preload",
]

#: ``0`` (``false``, ``no``, ``off``) turns the preload off (for a before/after measurement,
#: or a host where it breaks): :func:`preload_enabled`.
PRELOAD_ENV = "AGENTSPEC_PRELOAD"

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on", "")

_TCMALLOC = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
_IOMP = "libiomp5.so"
_LIB_DIRS = ("/usr/lib64", "/usr/lib", "/usr/local/lib")
_SPLITS = re.compile(r"[\s:]")
"""What ``LD_PRELOAD`` splits its list at (the dynamic loader takes spaces and colons)."""


def _lib_dirs() -> list[str]:
    """Where the system's libraries are: this machine's multiarch folder first (Debian's
    ``/usr/lib/x86_64-linux-gnu``, ``/usr/lib/aarch64-linux-gnu``, ...), any other, then
    :data:`_LIB_DIRS`."""
    multiarch = getattr(sys.implementation, "_multiarch", "") or f"{platform.machine()}-linux-gnu"
    dirs = [f"/usr/lib/{multiarch}", *sorted(glob.glob("/usr/lib/*-linux-gnu")), *_LIB_DIRS]
    return list(dict.fromkeys(dirs))


def _preloadable(path: str) -> bool:
    """Whether ``path`` can go into ``LD_PRELOAD``; warns when it cannot."""
    if _SPLITS.search(path):
        warnings.warn(
            f"not preloading {path!r} for vLLM's CPU backend: LD_PRELOAD splits paths at "
            "spaces and colons (install it, or the environment, under a path without them)",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True


def find_preload_libs(prefix: str | None = None) -> list[str]:
    """Paths of tcmalloc and (on x86) ``libiomp5.so`` that exist here, in that order.

    Args:
        prefix: the Python environment whose ``lib/`` holds ``intel-openmp``'s
            ``libiomp5.so`` (default: this interpreter's ``sys.prefix``).
    """
    if not sys.platform.startswith("linux"):
        return []
    found: list[str] = []
    dirs = _lib_dirs()
    for name in _TCMALLOC:
        hits = [os.path.join(d, name) for d in dirs if os.path.exists(os.path.join(d, name))]
        if hits:
            if _preloadable(hits[0]):
                found.append(hits[0])
            break
    if platform.machine() in ("x86_64", "AMD64"):
        iomp = os.path.join(prefix or sys.prefix, "lib", _IOMP)
        if os.path.exists(iomp) and _preloadable(iomp):
            found.append(iomp)
    return found


def preload_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``AGENTSPEC_PRELOAD`` in ``environ`` (default ``os.environ``) leaves the
    preload on: unset, empty, ``1``, ``true``, ``yes`` or ``on`` (any case) do; ``0``,
    ``false``, ``no`` or ``off`` turn it off.

    Raises:
        ValueError: any other value (a typo must not silently keep the preload on).
    """
    env = os.environ if environ is None else environ
    raw = env.get(PRELOAD_ENV, "")
    value = raw.strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError(
        f"{PRELOAD_ENV}={raw!r}: expected 0, false, no or off (no preload), or 1, true, yes "
        "or on (the default)"
    )


def preload_env(environ: Mapping[str, str] | None = None, prefix: str | None = None) -> str:
    """The ``LD_PRELOAD`` value for an engine process: the existing value plus the
    libraries of :func:`find_preload_libs` it lacks (unchanged when
    ``AGENTSPEC_PRELOAD`` turns it off, :func:`preload_enabled`, or on a vLLM that is not
    the CPU build).

    Raises:
        ValueError: ``AGENTSPEC_PRELOAD`` has a value :func:`preload_enabled` does not know.
    """
    env = os.environ if environ is None else environ
    current = env.get("LD_PRELOAD", "")
    if not preload_enabled(env):
        return current
    from agentspec_mw_vllm.engine import is_cpu_build

    if not is_cpu_build():
        return current
    parts = [p for p in _SPLITS.split(current) if p]
    names = {os.path.basename(p) for p in parts}
    for lib in find_preload_libs(prefix):
        if os.path.basename(lib) not in names:
            parts.append(lib)
    return ":".join(parts)


def with_preload(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default ``os.environ``) with :func:`preload_env`'s value."""
    env = dict(os.environ if environ is None else environ)
    value = preload_env(env)
    if value:
        env["LD_PRELOAD"] = value
    return env


def without_preload(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default ``os.environ``) with ``AGENTSPEC_PRELOAD=0`` and the
    libraries :func:`find_preload_libs` would add taken out of an inherited ``LD_PRELOAD``
    (a shell that exported the preload), others kept: a process started without it."""
    env = dict(os.environ if environ is None else environ)
    env[PRELOAD_ENV] = "0"
    ours = {*_TCMALLOC, _IOMP}
    kept = [p for p in _SPLITS.split(env.get("LD_PRELOAD", "")) if p]
    kept = [p for p in kept if os.path.basename(p) not in ours]
    if kept:
        env["LD_PRELOAD"] = ":".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


if __name__ == "__main__":  # a shell: export LD_PRELOAD="$(python -m ...)"
    try:
        print(preload_env())
    except ValueError as exc:
        print(f"agentspec_mw_vllm.preload: error: {exc}", file=sys.stderr)
        sys.exit(2)
