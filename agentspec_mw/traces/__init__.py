"""Agent traces: the record schema, streaming loaders, rendering and tokenization."""

from agentspec_mw.traces.loader import LoadStats, iter_records
from agentspec_mw.traces.schema import Message, TraceRecord

__all__ = ["LoadStats", "Message", "TraceRecord", "iter_records"]
