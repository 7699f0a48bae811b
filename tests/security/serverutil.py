"""Helpers of the security suite's real-server tests: raw requests and /metrics parsing."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

MODEL = "SmolLM2-135M-Instruct"
#: A prompt the drafter drafts for from its own text (a repetitive list).
REPETITIVE = "List the numbers from 1 to 20 separated by commas: 1, 2, 3, 4, 5, 6,"
_SERIES = re.compile(r"^(agentspec_[a-z_]+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def post(
    base: str,
    body: bytes | dict[str, Any],
    key: str | None = None,
    path: str = "/v1/completions",
    timeout: float = 120,
) -> tuple[int, Any]:
    """POST a body (bytes sent as they are); return the status and the parsed answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _parse(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _parse(exc.read())


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def completion(prompt: str, max_tokens: int, xargs: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return body


def series(metrics: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of ``name`` on a /metrics page, keyed by their sorted label pairs."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for line in metrics.splitlines():
        m = _SERIES.match(line)
        if m and m.group(1) == name:
            out[tuple(sorted(_LABEL.findall(m.group(2))))] = float(m.group(3))
    return out


def total(metrics: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for key, v in series(metrics, name).items() if want <= set(key))
