"""Greedy-oracle replay of agent traces through proposers, with a step-time model."""

from agentspec_mw.replay.run import ReplayConfig, ReplayReport, ResultRow, build_calls, run_replay
from agentspec_mw.replay.sim import ReplayCall, WorkloadRun, replay_workload

__all__ = [
    "ReplayCall",
    "ReplayConfig",
    "ReplayReport",
    "ResultRow",
    "WorkloadRun",
    "build_calls",
    "replay_workload",
    "run_replay",
]
