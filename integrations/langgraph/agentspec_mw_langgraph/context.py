"""The per-call tags ContextVar: set by the inline handler, read by the request layer.

:class:`~agentspec_mw_langgraph.handler.AgentSpecCallbackHandler` runs inline
(``run_inline = True``), so the value it sets in ``on_chat_model_start`` is visible in the
same context as the model call that follows it: sync or async, streaming or not, and each
concurrent branch sees its own value (LangGraph runs every task in a copied context).
It is reset to ``None`` when the call ends or errors.
"""

from __future__ import annotations

from contextvars import ContextVar

from agentspec_mw.tags import StructureTags, tags_to_wire

__all__ = ["current_tags", "current_wire_tags", "set_current_tags"]

_CURRENT: ContextVar[StructureTags | None] = ContextVar("agentspec_current_tags", default=None)


def current_tags() -> StructureTags | None:
    """The structure tags of the LLM call in progress in this context, if any."""
    return _CURRENT.get()


def current_wire_tags() -> dict[str, str | int | float] | None:
    """:func:`current_tags` in the flat wire encoding (``vllm_xargs`` / ``extra_args``)."""
    tags = _CURRENT.get()
    return None if tags is None else tags_to_wire(tags)


def set_current_tags(tags: StructureTags | None) -> None:
    """Set the tags of the call about to run in this context (``None`` clears them)."""
    _CURRENT.set(tags)
