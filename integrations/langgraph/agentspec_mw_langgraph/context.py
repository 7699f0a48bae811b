"""The per-call tags ContextVar: set by the inline handler, read by the request layer.

:class:`~agentspec_mw_langgraph.handler.AgentSpecCallbackHandler` runs inline
(``run_inline = True``), so the value it sets in ``on_chat_model_start`` is visible in the
same context as the model call that follows it: sync or async, streaming or not, and each
concurrent branch sees its own value (LangGraph runs every task in a copied context).
When the call ends or errors it is reset to what it replaced: ``None``, or the tags of
the call it was made in (a model calling a model during its generation). An end event can
arrive in another context than the call's (LangChain sends an async call's end from a task
of its own, whose context is a copy; an ``astream`` left early is closed by the event
loop's finaliser), so the handler also marks the call's :class:`CallTicket` ended, and
:func:`current_tags` / :func:`current_ticket` then answer, in every context still holding
it, what the ticket replaced when its call started (:attr:`CallTicket.previous`, itself
skipped once ended): what the end event would have restored there.

Beside the tags the handler sets a :class:`CallTicket`: where the call's tags may be sent
(the ``engine=`` server of ``with_agentspec``) and a record of whether a request layer
actually attached them. A layer that puts the tags on an outgoing request reads them with
:func:`deliver_wire_tags` (or calls :meth:`CallTicket.mark_delivered`), so that the
handler counts delivered tags apart from derived ones. A layer that reads the server's
per-call speculation stats from the response records them on the ticket
(:meth:`CallTicket.record_spec_decoding`); the handler puts them on the call's message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar

from agentspec_mw.tags import StructureTags, tags_to_wire

__all__ = [
    "CallTicket",
    "current_call",
    "current_tags",
    "current_ticket",
    "current_wire_tags",
    "deliver_wire_tags",
    "set_current_tags",
]


class CallTicket:
    """The delivery record of one tagged LLM call.

    Args:
        engine_url: the normalised base URL of the server this call's tags go to through
            the OpenAI-SDK hook (``None``: no server registered).
        on_first_delivery: called once, when the tags are first attached to a request.
        headers: request headers a layer that attaches the tags also sends (the routing
            key of :mod:`~agentspec_mw_langgraph.routing`); a header the request already
            has wins.
        previous: the tags and ticket current in the call's context when it started
            (:func:`current_tags`, :func:`current_ticket`), which that context reads again
            once this ticket has ended.
    """

    def __init__(
        self,
        engine_url: str | None = None,
        on_first_delivery: Callable[[], None] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        previous: tuple[StructureTags | None, CallTicket | None] = (None, None),
    ) -> None:
        self.engine_url = engine_url
        self.headers: dict[str, str] = dict(headers or {})
        self.previous = previous
        """What this call's tags replaced in its context (the calling model's, or none):
        current there again once it ended, wherever its end event ran."""
        self._on_first_delivery = on_first_delivery
        self._lock = threading.Lock()
        self._delivered = 0
        self._missed: dict[str, str] = {}
        self._spec_decoding: dict[str, int] | None = None
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether the call has ended (its tags are then no longer current anywhere)."""
        return self._ended

    def end(self) -> None:
        """Record that the call ended (the handler does it at the call's end event)."""
        self._ended = True

    @property
    def delivered(self) -> int:
        """Requests of this call that carried its tags."""
        with self._lock:
            return self._delivered

    @property
    def missed(self) -> dict[str, str]:
        """Servers this call sent requests to without its tags: normalised URL -> as given."""
        with self._lock:
            return dict(self._missed)

    def mark_delivered(self) -> None:
        """Record that a request of this call carried its tags."""
        with self._lock:
            self._delivered += 1
            first = self._delivered == 1
        if first and self._on_first_delivery is not None:
            self._on_first_delivery()

    @property
    def spec_decoding(self) -> dict[str, int] | None:
        """The speculation stats a response of this call reported (the last one read),
        ``{"num_draft_tokens": ..., "num_accepted_draft_tokens": ...}``; ``None``: none."""
        with self._lock:
            return None if self._spec_decoding is None else dict(self._spec_decoding)

    def record_spec_decoding(self, stats: Mapping[str, int]) -> None:
        """Record the speculation stats of a response of this call (a retried
        request's replace those of the attempt before)."""
        with self._lock:
            self._spec_decoding = dict(stats)

    def mark_missed(self, key: str, url: str) -> None:
        """Record a request of this call sent to ``url`` (normalised ``key``) without tags."""
        with self._lock:
            self._missed.setdefault(key, url)


_CURRENT: ContextVar[StructureTags | None] = ContextVar("agentspec_current_tags", default=None)
_TICKET: ContextVar[CallTicket | None] = ContextVar("agentspec_current_ticket", default=None)


def _resolve() -> tuple[StructureTags | None, CallTicket | None]:
    """The tags and ticket of the call in progress in this context. An ended ticket reads
    as what it replaced (:attr:`CallTicket.previous`): its end event, sent from another
    context (an async call's), could not restore that here. Each ``previous`` was live when
    its ticket started, so the walk is as long as the calls were nested."""
    tags, ticket = _CURRENT.get(), _TICKET.get()
    while ticket is not None and ticket.ended:
        tags, ticket = ticket.previous
    return (tags, ticket) if tags is not None else (None, None)


def current_call() -> tuple[StructureTags | None, CallTicket | None]:
    """:func:`current_tags` and :func:`current_ticket` read together (one consistent pair,
    what a call starting here replaces: its :attr:`CallTicket.previous`)."""
    return _resolve()


def current_tags() -> StructureTags | None:
    """The structure tags of the LLM call in progress in this context, if any (once its
    ticket is :attr:`~CallTicket.ended`: those of the call it was made in, if any)."""
    return _resolve()[0]


def current_wire_tags() -> dict[str, str | int | float] | None:
    """:func:`current_tags` in the flat wire encoding (``vllm_xargs`` / ``extra_args``)."""
    tags = current_tags()
    return None if tags is None else tags_to_wire(tags)


def current_ticket() -> CallTicket | None:
    """The :class:`CallTicket` of the LLM call in progress in this context, if any (never
    an :attr:`~CallTicket.ended` one: then that of the call it was made in, if any)."""
    return _resolve()[1]


def deliver_wire_tags() -> dict[str, str | int | float] | None:
    """:func:`current_wire_tags` for a request about to be sent: records the delivery.

    Call it only where the result is attached to an outgoing request.
    """
    tags, ticket = _resolve()
    if tags is None:
        return None
    if ticket is not None:
        ticket.mark_delivered()
    return tags_to_wire(tags)


def set_current_tags(tags: StructureTags | None, ticket: CallTicket | None = None) -> None:
    """Set the tags of the call about to run in this context (``None`` clears them), with
    the call's :class:`CallTicket` (dropped when ``tags`` is ``None``)."""
    _CURRENT.set(tags)
    _TICKET.set(ticket if tags is not None else None)
