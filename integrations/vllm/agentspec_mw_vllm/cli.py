"""The vLLM subcommands of the ``agentspec`` command line: ``agentspec serve`` and
``agentspec cluster``."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

__all__ = [
    "add_cluster_command",
    "add_commands",
    "add_serve_arguments",
    "serve_config_from_args",
]


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``agentspec serve``."""
    p.add_argument("--model", default=None, help="HF model id or folder (default: SmolLM2-135M)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--speculative",
        default="agentspec",
        help="agentspec (default), ngram, suffix, none, or a proposer dotted path",
    )
    p.add_argument("--k", type=int, default=8, help="draft tokens per request per step")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--proposer-options", default="{}", help="JSON object of proposer options")
    p.add_argument(
        "--cost-model",
        default=None,
        help='cost-model preset for the budget, or "measured" (fitted to the engine\'s steps)',
    )
    p.add_argument(
        "--scope-keys",
        default=None,
        metavar="FILE",
        help='JSON {"api-key": "scope"}: bind each key\'s requests to its isolation scope '
        "(unknown keys get HTTP 401)",
    )
    p.add_argument(
        "--scope-header",
        default=None,
        metavar="NAME",
        help="take the scope from this header, set by a trusted proxy (e.g. X-Tenant-Id)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body accepted (default 16 MiB)",
    )
    p.add_argument(
        "--metrics-labels",
        default=None,
        help="agentspec_* metric labels: agent, scope (comma-separated) or none "
        "(default agent; none with --scope-keys/--scope-header)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the server command and exit")
    p.add_argument(
        "vllm_args", nargs=argparse.REMAINDER, help="after --: more vLLM api_server arguments"
    )


def serve_config_from_args(args: argparse.Namespace) -> Any:
    """Build a :class:`~agentspec_mw_vllm.serve.ServeConfig` from parsed arguments."""
    from agentspec_mw_vllm.serve import ServeConfig

    try:
        options = json.loads(args.proposer_options)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--proposer-options is not JSON: {exc}") from None
    extra = list(args.vllm_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    return ServeConfig(
        model=args.model,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        speculative=None if args.speculative == "none" else args.speculative,
        k=args.k,
        max_model_len=args.max_model_len,
        proposer_options=options,
        cost_model=args.cost_model,
        extra_args=extra,
        scope_keys=args.scope_keys,
        scope_header=args.scope_header,
        metrics_labels=args.metrics_labels,
        **({"max_body_bytes": args.max_body_bytes} if args.max_body_bytes is not None else {}),
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    from agentspec_mw_vllm.serve import serve, server_command

    cfg = serve_config_from_args(args)
    if args.dry_run:
        print(shlex.join(server_command(cfg)))
        return 0
    return serve(cfg)


def add_commands(sub: Any) -> None:
    """Add ``serve`` and ``cluster`` to the ``agentspec`` subcommands (called by
    ``agentspec_mw.cli``)."""
    p = sub.add_parser(
        "serve",
        help="start vLLM's OpenAI-compatible server with the AgentSpec drafter",
        description=(
            "Start vLLM's OpenAI-compatible server (python -m vllm.entrypoints.openai."
            "api_server) with the AgentSpec drafter, bound to 127.0.0.1 unless --host says "
            "otherwise. Requests carry structure tags in the body as vllm_xargs."
        ),
    )
    add_serve_arguments(p)
    p.set_defaults(func=_cmd_serve)
    add_cluster_command(sub)


def _cmd_cluster(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from agentspec_mw_vllm.cluster import ClusterConfig, run_cluster

    serve_args = list(args.serve_args)
    if serve_args and serve_args[0] == "--":
        serve_args = serve_args[1:]
    cfg = ClusterConfig(
        replicas=args.replicas,
        host=args.host,
        port=args.port,
        policy=args.policy,
        serve_args=tuple(serve_args),
        router_args=tuple(shlex.split(args.router_args)),
    )
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="agentspec-cluster-"))
    log_dir.mkdir(parents=True, exist_ok=True)  # a bad --log-dir fails before any process
    return run_cluster(cfg, log_dir)


def add_cluster_command(sub: Any) -> None:
    """Add ``cluster``: replicas of ``agentspec serve`` behind ``vllm-router``."""
    p = sub.add_parser(
        "cluster",
        help="start agentspec serve replicas behind vllm-router (affinity by x-session-id)",
        description=(
            "Start --replicas `agentspec serve` processes on ports PORT+1.. and vllm-router "
            "on PORT in front of them (agentspec_mw_vllm.cluster); Ctrl-C stops them all. "
            "Arguments after -- go to every agentspec serve (a second -- inside them goes "
            "on to vLLM)."
        ),
    )
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="the router's port")
    p.add_argument(
        "--policy",
        default="consistent_hash",
        choices=["consistent_hash", "round_robin", "random", "power_of_two", "cache_aware"],
        help="vllm-router policy (consistent_hash: one x-session-id, one replica)",
    )
    p.add_argument("--router-args", default="", help="more vllm-router arguments, one string")
    p.add_argument("--log-dir", default=None, help="where the logs go (default: a temp dir)")
    p.add_argument("serve_args", nargs=argparse.REMAINDER, help="after --: agentspec serve args")
    p.set_defaults(func=_cmd_cluster)
