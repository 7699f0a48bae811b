"""The proposer interface shared by the replay tool, the vLLM adapter and the tests.

A *proposer* guesses the next tokens of each request in a batch from text it has seen.
Its lifecycle has four verbs, modelled on ArcticInference's ``SuffixDecodingCache``:

* :meth:`Proposer.start` — a request enters, with its prompt token ids and optional tags;
* :meth:`Proposer.extend` — the engine accepted these tokens for the request (the first
  call after ``start`` carries the token produced by prefill);
* :meth:`Proposer.propose` — draft up to ``k`` tokens for each of a batch of requests;
* :meth:`Proposer.stop` — the request left the batch; its per-request state is released.

A proposer may also take a step's accepted tokens in one call, ``extend_many(req_ids,
token_ids, lens)`` (request ``req_ids[i]`` gets the next ``lens[i]`` of the concatenated
``token_ids``, as one ``extend`` each would): optional, all or nothing (it raises before
applying anything), and used by the replay and the vLLM adapter where present (AgentSpec
has it).

A proposer's ``start`` may also take a keyword ``decoding``, the request's decoding regime
(:data:`Decoding`: ``"greedy"``, ``"sampled"`` or ``"constrained"``): optional, and passed
by the vLLM adapter only to proposers whose ``start`` names it (AgentSpec calibrates each
regime apart); the replay's requests are greedy.

``propose`` is batched on purpose: a budget-aware proposer (AgentSpec) splits one step's
free token budget across the batch, so it must see the whole batch and the step's shape
(:class:`StepContext`). Implementations never return more than ``k`` tokens for a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from agentspec_mw.tags import StructureTags

__all__ = [
    "DECODINGS",
    "Decoding",
    "Draft",
    "EMPTY_DRAFT",
    "Proposer",
    "ProposerEnv",
    "StepContext",
    "TokenIds",
]

#: Token ids as the host holds them: a list, a tuple or a 1-D integer array.
TokenIds: TypeAlias = Sequence[int] | np.ndarray

#: How the engine picks a request's tokens, which decides how a draft token is accepted:
#: ``greedy`` (it is the argmax), ``sampled`` (temperature > 0: with the model's
#: probability of it), ``constrained`` (greedy under a grammar: structured outputs).
Decoding: TypeAlias = Literal["greedy", "sampled", "constrained"]
DECODINGS: tuple[Decoding, ...] = ("greedy", "sampled", "constrained")


@dataclass(frozen=True, slots=True)
class Draft:
    """Draft tokens for one request, with the proposer's per-token confidence.

    ``probs[i]`` is the proposer's estimate that token ``i`` is right given that tokens
    ``0..i-1`` are; an empty ``probs`` means the proposer gives no estimate. ``block``: the
    block kind the request is in as the draft starts, for a proposer that tracks blocks
    (AgentSpec; what its ``block_of`` returns right after ``propose``), else ``None``:
    the vLLM adapter labels the draft's verification metrics with it.
    """

    token_ids: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    block: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)


EMPTY_DRAFT = Draft()


@dataclass(frozen=True, slots=True)
class StepContext:
    """The shape of the engine step the drafts are for.

    Attributes:
        batch_size: requests that decode in this step (one token each before any draft),
            whether or not the call asks a draft for each: the replay and the vLLM adapter
            both count every decoding request, so ``req_ids`` of the call may be fewer
            (the adapter asks none for a request at its length limit). Prefilling
            requests are not counted.
        num_kv_tokens: KV-cache tokens resident for those requests (sum of their context
            lengths).
        max_num_batched_tokens: the scheduler's token budget for the step, if known.
        num_decode_tokens: tokens the step schedules for decoding requests before any
            draft (one per decoding request); with ``max_num_batched_tokens``, the budget
            drafts and prefill chunks share is ``max_num_batched_tokens -
            num_decode_tokens``. 0 when unknown.
        num_prefill_tokens: prompt tokens waiting to be prefilled (requests prefilling
            or queued, less what the prefix cache holds as far as known). vLLM schedules
            decodes and drafts first: every draft token at a step whose budget is full
            displaces one of these. ``None`` when the host cannot see the queue (the vLLM
            adapter without the scheduler's count, :mod:`agentspec_mw_vllm.queue`);
            AgentSpec's budget then prices drafts as if prompts filled the step
            (:func:`agentspec_mw.agentspec.budget.step_shape`).
        kv_capacity_tokens: KV-cache tokens the engine holds in all, if known.
        num_free_kv_tokens: KV-cache tokens not held by running requests (cached blocks
            of finished requests count as free), if known.
    """

    batch_size: int
    num_kv_tokens: int = 0
    max_num_batched_tokens: int | None = None
    num_decode_tokens: int = 0
    num_prefill_tokens: int | None = None
    kv_capacity_tokens: int | None = None
    num_free_kv_tokens: int | None = None


@runtime_checkable
class Proposer(Protocol):
    """What every proposer implements (see the module docstring for the lifecycle)."""

    name: str

    def start(self, req_id: str, prompt_ids: TokenIds, tags: StructureTags | None = None) -> None:
        """Register a request with its prompt. Restarting a live id replaces its state."""
        ...

    def extend(self, req_id: str, token_ids: TokenIds) -> None:
        """Append tokens the engine accepted for ``req_id`` (the request's own output).

        ``token_ids`` may be a read-only array (the vLLM adapter passes its own fresh,
        read-only copy, which the proposer may keep without copying): copy before writing."""
        ...

    def propose(self, req_ids: Sequence[str], k: int, step: StepContext) -> list[Draft]:
        """Return one draft per request id, each at most ``k`` tokens long."""
        ...

    def stop(self, req_id: str) -> None:
        """Release the request's per-request state (idempotent)."""
        ...


@dataclass(frozen=True)
class ProposerEnv:
    """What the host gives a proposer at construction (everything optional).

    Attributes:
        token_bytes: the UTF-8 bytes each token id decodes to (index = token id), built
            once per tokenizer; proposers that follow text structure need it.
        cost_model: a step-time model (``step_time(num_batched, num_kv)``) for budgets.
        max_k: the largest ``k`` the host will ask for.
    """

    token_bytes: Sequence[bytes] | None = None
    cost_model: object | None = None
    max_k: int = 32
