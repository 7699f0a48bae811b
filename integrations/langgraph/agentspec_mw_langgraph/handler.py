"""The inline callback adapter: tags every LLM call of a graph run and builds its
redundancy graph.

One :class:`AgentSpecCallbackHandler` serves any number of concurrent runs. Its state is
keyed by root run (the outermost run it sees) and guarded by one lock; the work per event
is a few dict operations, so it never blocks the event loop. A root's state is released
when the root run ends (or errors, e.g. on an interrupt); the redundancy graph of a query
outlives it (the last ``graph_history`` finished queries are kept for inspection).

A query is one graph run, or the runs of one thread (``thread_id``) one after another:
a graph run that finds its thread held by another graph run of the process still running
(``app.batch(inputs, config)`` with one ``thread_id`` for all, two apps run at once on
one thread; any handler, same scope) is a query of its own,
``thread:<thread_id>|run:<root run id>``, so concurrent runs never share groups,
relations or learned segments; the thread's next run joins its query again. A run holds
its thread from its first child run until it ends (or errors, is interrupted, or its
stream is closed): a start another handler rejected holds nothing.

A graph (or retriever) run whose start never completed -- another handler rejected it
(``raise_error``), this handler's own start failed under ``adapter_raise_errors``, or its
task was cancelled while other handlers' starts ran -- gets no end event: its state is
dropped (no graph kept) at the next event once LangChain has let its run id go. The handler
keeps only a weak reference to the run id object it is given, which LangChain's run
manager holds for as long as the run may send events (its own tables key the run by an
equal copy).

Events seen twice (the same handler passed again at call time) are ignored by run id.
A wrapped app run inside another wrapped app's run (mounted as a node, or invoked from
one) is left to the outer app's handler: a handler ignores runs nested in a run another
live handler tracks, so each outer run is one query with one set of tags, whatever order
LangChain calls the handlers in.

A call whose asyncio task was cancelled without an end event (LangChain sends none, e.g.
under ``asyncio.wait_for``) is ended as failed when the next call starts or its root run
ends, so it neither stays ``running`` in the redundancy graph nor holds its ordinal (a
task that finished otherwise may have left its call running: a stream whose first chunk
it awaited).
A task a checkpointed graph re-runs after an error (``invoke(None, config)`` on the same
thread) is a ``retry`` of its failed attempt, as under a ``RetryPolicy``; a task resumed
after an interrupt is not.
Any failure inside the adapter means "no tags" for that call, a logged warning and
``stats.adapter_errors += 1`` -- unless ``raise_error`` is set (tests), then it raises.

A call outside any graph run whose start another handler rejected (``raise_error``:
LangChain then sends no end event) is dropped as failed at the next call started in the
same context -- a call counts as rejected only while no token, no end event and no request
of it was seen, so a stream still being consumed stays open -- and such open calls are
bounded (the oldest are dropped first); a rejected call of a graph run is released with its
root run.

A model that calls another model during its generation has its tags back in its context
when that call ends. In sync code the end event restores them; LangChain sends an async
call's end event from a task of its own (``shielded``), whose context is a copy, so there
the caller's context keeps the ended call's ticket, which reads as the tags it replaced
when it started (:attr:`~agentspec_mw_langgraph.context.CallTicket.previous`). The
context, not the run tree, is what links the two: LangChain makes the inner call a child
of the node run, not of the calling model's run.

Batches (``generate``/``agenerate`` with several prompts) start every call before any of
them runs, so their tags are not published in the ContextVar (one variable cannot hold
several calls' tags): a request layer with the call's run manager reads them by run id
(:meth:`AgentSpecCallbackHandler.tags_for_call`, as ``ChatAgentSpecVLLM`` does); others
send those requests untagged.

Derived is not delivered: ``stats.tags_derived`` counts calls that got tags,
``stats.tags_delivered`` those whose tags a request layer attached to an outgoing request
(the OpenAI hook, the tagging transports, the engine-backed chat model; see
:class:`~agentspec_mw_langgraph.context.CallTicket`). A call that sent an OpenAI request
to a server other than the ``engine=`` URL (or with no ``engine=``) and delivered nothing
logs a warning at its end, once per server, naming the ``engine=`` to pass. The tags are
also added to the model run's metadata (``agentspec_*`` keys), so tracers such as
LangSmith show them (not for the calls of a batch: they share one metadata dict). Each
call's requests also carry a routing key header (``x-session-id`` by default;
:mod:`~agentspec_mw_langgraph.routing`), so a router keeps a query on one replica. When a
request layer read the server's per-call speculation stats from the call's response
(:mod:`~agentspec_mw_langgraph.spec_stats`), the call's message gets them as
``response_metadata["speculative_decoding"]`` at its end (a stream: its usage chunk as it
passes, the stats having arrived with it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk, LLMResult

from agentspec_mw.tags import MAX_ID_CHARS, Segment, StructureTags, tags_to_wire
from agentspec_mw.traces.schema import TraceRecord
from agentspec_mw_langgraph import derive
from agentspec_mw_langgraph.config import TaggingConfig
from agentspec_mw_langgraph.context import (
    CallTicket,
    current_call,
    current_ticket,
    set_current_tags,
)
from agentspec_mw_langgraph.messages import (
    has_tool_calls,
    is_tool_result,
    output_text,
    to_openai_messages,
    trailing_tool_call_ids,
)
from agentspec_mw_langgraph.openai_hook import server_key
from agentspec_mw_langgraph.recorder import TraceRecorder
from agentspec_mw_langgraph.redundancy import CallNode, RedundancyGraph
from agentspec_mw_langgraph.routing import tags_routing_key
from agentspec_mw_langgraph.spec_stats import SPEC_DECODING_KEY

__all__ = ["AdapterStats", "AgentSpecCallbackHandler"]

_log = logging.getLogger(__name__)
_TRACE_SOURCE = "agentspec-mw-langgraph"
_MAX_OBSERVATIONS = 256  # tool results remembered per query, to link the call reading them
_OPENAI_API = "https://api.openai.com:"
_MAX_OPEN_CALLS = 1024  # LLM calls outside any graph run held open at most (oldest dropped)
# handler id -> the run id of the LLM call this context started last and has not ended
_IN_FLIGHT: ContextVar[dict[int, UUID] | None] = ContextVar("agentspec_in_flight", default=None)
_HANDLERS: weakref.WeakSet[AgentSpecCallbackHandler] = weakref.WeakSet()
"""Every live handler: a run nested in a run another of them tracks is left to it."""
# guards _HANDLERS: a set iterated while another thread adds to it raises RuntimeError
_HANDLERS_LOCK = threading.Lock()
_ThreadKey = tuple[str, str]  # (scope, thread query id)
_THREAD_RUNS: dict[_ThreadKey, tuple[weakref.ref[AgentSpecCallbackHandler], UUID]] = {}
"""The graph run holding each thread's query in this process: its handler and root run."""
_THREAD_RUNS_LOCK = threading.Lock()  # taken inside a handler's lock, never the reverse


def _claim_thread(key: _ThreadKey, handler: AgentSpecCallbackHandler, root: UUID) -> bool:
    """Make graph run ``root`` the holder of a thread's query unless another graph run
    (of any handler: its tags go to the same engine) holds it; a holder is freed when its
    root run is released (:func:`_free_thread`) or its handler is gone."""
    with _THREAD_RUNS_LOCK:
        held = _THREAD_RUNS.get(key)
        if held is not None and held[0]() is not None:
            return False
        _THREAD_RUNS[key] = (weakref.ref(handler), root)
        return True


def _free_thread(key: _ThreadKey, root: UUID) -> None:
    """Release a thread's query held by graph run ``root``."""
    with _THREAD_RUNS_LOCK:
        held = _THREAD_RUNS.get(key)
        if held is not None and held[1] == root:
            del _THREAD_RUNS[key]


# what a task call's attempts share: each level's (node, step, push index), the ordinal
_AttemptKey = tuple[tuple[tuple[str | None, int | None, int | None], ...], int]


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop in this thread
        return None


class _Abandoned(Exception):
    """The error an LLM call is ended with when no end event will come for it."""


@dataclass
class AdapterStats:
    """Counters of one handler (read :attr:`AgentSpecCallbackHandler.stats`)."""

    llm_calls: int = 0
    """LLM calls seen."""
    tags_derived: int = 0
    """LLM calls that got tags (derived; sent or not)."""
    tags_delivered: int = 0
    """LLM calls whose tags were attached to at least one outgoing request."""
    adapter_errors: int = 0
    """Adapter failures (each meant no tags for a call, a lost graph update or a lost trace
    record; the log line says which)."""
    duplicate_events: int = 0
    """Events ignored because their run id was already seen."""
    traces_recorded: int = 0
    """Trace records queued for writing."""

    @property
    def tagged_calls(self) -> int:
        """The former name of :attr:`tags_derived` (calls that got tags, sent or not)."""
        return self.tags_derived


@dataclass
class _Run:
    root: UUID
    parent: UUID | None
    node: str | None  # set for node runs (name == metadata["langgraph_node"])
    step: int | None
    namespace: str
    push_index: int | None
    run_id: UUID | None = None  # None: known from a call's metadata only
    task_call: bool = False  # pushed by a functional @task call (not a Send)
    tool_call_id: str | None = None  # a tool run's, from its start (an error has no output)


@dataclass
class _Attempt:
    """The last attempt of a task's call (see :func:`_is_retry`)."""

    call: str
    first_namespace: str  # the first attempt's: the retry group is named after it
    levels: tuple[tuple[UUID | None, str], ...]  # (node run, namespace) per level


@dataclass
class _Root:
    query_id: str
    run_ids: set[UUID] = field(default_factory=set)
    ordinals: dict[UUID | None, int] = field(default_factory=dict)  # node run -> next ordinal
    # node run -> ordinals of its failed calls, handed out again (smallest first)
    free_ordinals: dict[UUID | None, set[int]] = field(default_factory=dict)
    attempts: dict[_AttemptKey, _Attempt] = field(default_factory=dict)
    failed_runs: set[UUID] = field(default_factory=set)  # node runs ended by an error
    thread: _ThreadKey | None = None  # the thread whose query this graph run holds
    # False: a threaded graph run whose first child run has not started yet; it holds no
    # thread and no query until then (see AgentSpecCallbackHandler._settle)
    opened: bool = True
    thread_id: Any = None  # the run's thread_id, for the query id its first child settles


@dataclass
class _Instance:
    """The calls of one agent instance so far, for their ``repeat`` and ``parallel``
    relations. A batch is the calls of one node run that ran at the same time: each
    started while another of them was still running."""

    last: str  # the call a later sequential call repeats: the last one to start
    before: str | None  # the call the current batch's calls repeat
    first: str  # the current batch's first call (its parallel group is named after it)
    scope: object  # the current batch's node run (None: calls never batch)
    running: deque[str]  # the current batch's calls, oldest first; ended ones pruned lazily


@dataclass
class _Query:
    graph: RedundancyGraph
    trace_run: str  # the run_id of its trace records (see _open_query)
    active_roots: int = 0
    next_call_index: int = 0
    instances: dict[str, _Instance] = field(default_factory=dict)
    after_tool: dict[str, Segment] = field(default_factory=dict)  # agent -> actual segment
    observations: dict[str, str] = field(default_factory=dict)  # tool_call_id -> call id
    # the attempts of a root run that failed: its tasks re-run under the next root retry them
    failed_attempts: dict[_AttemptKey, _Attempt] = field(default_factory=dict)
    # the rounds of functional @task calls (see _round_of), the _MAX_OBSERVATIONS used
    # last of each: a reply (_reply_key) -> its call ("": several task runs replied so)
    replies: dict[str, str] = field(default_factory=dict)
    # call id -> its task run's turn, and its agent instance
    calls_round: dict[str, tuple[_Turn, str]] = field(default_factory=dict)
    runs_round: dict[str, _Turn] = field(default_factory=dict)  # task run namespace -> its
    runs_last: dict[str, str] = field(default_factory=dict)  # run + instance -> last call


@dataclass(frozen=True)
class _Turn:
    """The round of a functional ``@task`` run at its fan-out position (see
    :func:`_round_of`)."""

    position: str  # the fan-out group id without round and ordinal
    round: int
    run: str  # the task run's namespace
    prefix: str  # its calls' agent instance down to the task level (a continued run's)


@dataclass
class _Live:
    root: UUID
    node_run: UUID | None
    call: CallNode
    query_id: str
    tags: StructureTags
    call_index: int
    trace_run: str  # its trace record's run_id
    after_tool: bool
    prompt: list[dict[str, Any]] | str
    model: str
    ticket: CallTicket | None = None
    streamed: bool = False  # a token of it arrived (it runs: its start was not rejected)
    task: asyncio.Task[Any] | None = None  # the asyncio task that made it, if any
    started: float | None = None  # wall clock (s) when its tags were made: its start


def _is_interrupt(error: BaseException) -> bool:
    """LangGraph's interrupts (and other control flow it raises through runs)."""
    try:
        from langgraph.errors import GraphBubbleUp
    except ImportError:  # pragma: no cover - langgraph is a dependency
        return False
    return isinstance(error, GraphBubbleUp)


def _round_of(
    query: _Query, position: str, run: str, prompt: Sequence[BaseMessage] | str
) -> tuple[int, _Turn | None, list[str]]:
    """The round of a functional ``@task`` run at fan-out ``position``, from its first
    call's ``prompt``: one more than the latest round whose replies it carries (replies of
    earlier runs of that position), else 0; and, if it carries replies of exactly one run
    of that round, that run and its calls carried, in the prompt's order (this run
    continues them).

    Every call of one ``@task`` from one entrypoint run takes the same position, whether
    the calls ran together or one after another, and a callback cannot tell the two
    apart by timing (a sibling may end before the next is submitted). A prompt that
    carries a reply can: that call had ended before this one began. So the turns of a
    functional ReAct loop are rounds 0, 1, 2, … of one member each, a round of
    refinements of one draft is round 1, and two agents looping side by side have their
    turn ``n`` in round ``n`` together, as a ``Send`` fan-out's steps are."""
    if isinstance(prompt, str) or not query.replies:
        return 0, None, []
    best = -1
    runs: dict[str, tuple[_Turn, list[str]]] = {}  # the carried runs of the latest round
    for message in prompt:
        key = _reply_key(message) if isinstance(message, AIMessage) else None
        call_id = query.replies.get(key) if key is not None else None
        known = query.calls_round.get(call_id) if call_id else None
        if key is None or call_id is None or known is None:
            continue
        turn = known[0]
        if turn.position != position or turn.run == run:
            continue
        _remember(query.replies, key, call_id)  # in use: kept
        _remember(query.calls_round, call_id, known)
        if turn.round > best:
            best, runs = turn.round, {}
        if turn.round == best:
            runs.setdefault(turn.run, (turn, []))[1].append(call_id)
    if best < 0:
        return 0, None, []
    if len(runs) != 1:  # a new round of several (a debate's next round): no one agent's
        return best + 1, None, []
    ((turn, calls),) = runs.values()
    return best + 1, turn, calls


def _reply_key(message: BaseMessage) -> str | None:
    """What identifies a reply when a later prompt carries it: its id with a digest of its
    text and tool calls (a model may set the same id on every reply), or ``None``."""
    if not message.id:
        return None
    calls = tuple(str(c.get("id")) for c in getattr(message, "tool_calls", None) or ())
    digest = hashlib.blake2b(repr((message.content, calls)).encode(), digest_size=8)
    return f"{message.id}\x1f{digest.hexdigest()}"


def _remember(table: dict[str, Any], key: str, value: Any) -> None:
    """Put ``key`` in a table of the :data:`_MAX_OBSERVATIONS` entries used last."""
    table.pop(key, None)
    table[key] = value
    while len(table) > _MAX_OBSERVATIONS:  # oldest first
        del table[next(iter(table))]


def _bounded(text: str, limit: int = MAX_ID_CHARS) -> str:
    """Keep an id within ``limit`` characters (the tag limit; long ids keep a prefix and
    get a hash suffix)."""
    if len(text) <= limit:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    return f"{text[: limit - 17]}~{digest}"


def _valid_unicode(value: Any) -> tuple[Any, bool]:
    """``value`` (text, or a JSON value holding text) with each lone surrogate replaced by
    U+FFFD, and whether any text changed. A lone surrogate (``"\\ud83d"``: half of a split
    emoji) is not valid Unicode, which a trace record refuses; a high surrogate followed by
    a low one becomes the character the pair encodes, as a ``\\ud83d\\ude00`` JSON escape
    would."""
    if isinstance(value, str):
        if value.isascii():
            return value, False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            utf16 = value.encode("utf-16-le", "surrogatepass")
            return utf16.decode("utf-16-le", "replace"), True
        return value, False
    if isinstance(value, dict):
        pairs = [(_valid_unicode(k), _valid_unicode(v)) for k, v in value.items()]
        if not any(k[1] or v[1] for k, v in pairs):
            return value, False
        return {k[0]: v[0] for k, v in pairs}, True
    if isinstance(value, list | tuple):
        items = [_valid_unicode(v) for v in value]
        if not any(changed for _, changed in items):
            return value, False
        return type(value)(v for v, _ in items), True
    return value, False


def _engine_url(engine: Any) -> str | None:
    """The server key of ``engine``: a URL string, or an OpenAI chat model's base URL."""
    if isinstance(engine, str):
        return server_key(engine)
    base = getattr(engine, "openai_api_base", None)  # ChatOpenAI(base_url=...)
    return server_key(base) if isinstance(base, str) and base else None


def _attach_spec_decoding(response: LLMResult, ticket: CallTicket) -> None:
    """Put the stats the call's response reported on its (first) message, unless it has
    its own (the engine-backed chat model sets them itself)."""
    stats = ticket.spec_decoding
    if stats is None or not response.generations or not response.generations[0]:
        return
    metadata = getattr(
        getattr(response.generations[0][0], "message", None), "response_metadata", None
    )
    if isinstance(metadata, dict):
        metadata.setdefault(SPEC_DECODING_KEY, stats)


def _is_task_call(path: Any) -> bool:
    """Whether a task was pushed by a functional ``@task`` call (its path holds the calling
    task's path), not by a ``Send``."""
    return (
        isinstance(path, tuple | list)
        and len(path) >= 2
        and path[0] == "__pregel_push"
        and isinstance(path[1], tuple | list)
    )


def _push_index(path: Any) -> int | None:
    """The index of a pushed task: ``("__pregel_push", i, ...)`` for a ``Send``;
    ``("__pregel_push", <the calling task's path>, i, ...)`` for a functional ``@task``."""
    if not isinstance(path, tuple | list) or len(path) < 2 or path[0] != "__pregel_push":
        return None
    if isinstance(path[1], tuple | list):
        index = path[2] if len(path) >= 3 else None
    else:
        index = path[1]
    return index if isinstance(index, int) else None


def _invocation(namespace: str) -> str:
    """``".<n>"`` when the task of ``namespace`` (its last part) runs in the ``n``-th
    re-invocation (``n >= 1``) of its graph by the calling task: LangGraph counts a task's
    repeated invocations of one subgraph with an all-digit part before the inner task's
    (``"outer:t1|1|worker:t3"``); ``""`` for the first invocation or a root-graph task."""
    parts = namespace.split("|")[:-1]
    digits = []
    while parts and parts[-1].isdigit():
        digits.append(parts.pop())
    return "".join(f".{d}" for d in reversed(digits))


def _is_retry(previous: _Attempt, levels: Sequence[_Run]) -> bool:
    """Whether a call with the attempt key of ``previous`` (the same node, step and push
    index at every level, the same ordinal) re-runs its task. The outermost level whose
    node run differs (or is unknown) is the one run again: a retry re-runs the same task
    there, so that level's namespace (ending in its task id) is the same, while a node run
    invoking a subgraph a second time makes new tasks there. (Below that level the tasks of
    a re-run subgraph all get new ids.) With every node run the same, the call took the
    ordinal of a failed call of its node run."""
    for (run_id, namespace), level in zip(previous.levels, levels, strict=True):
        if run_id is None or run_id != level.run_id:
            return namespace == level.namespace
    return True


class AgentSpecCallbackHandler(BaseCallbackHandler):
    """Derives structure tags for every LLM call and publishes them (see the module doc).

    The tags of the call in progress are set in a ContextVar
    (:func:`~agentspec_mw_langgraph.context.current_tags`) for the request layer (not for
    a call of a batch), and are also available by run id (:meth:`tags_for_call`,
    :meth:`ticket_for_call`).
    """

    run_inline = True

    def __init__(self, config: TaggingConfig | None = None, *, engine: Any = None) -> None:
        super().__init__()
        self.config = config or TaggingConfig()
        self.raise_error = self.config.adapter_raise_errors
        self.engine = engine
        """The engine, chat model or server URL given to ``with_agentspec``."""
        self.engine_url = _engine_url(engine)
        """The normalised server URL whose OpenAI-SDK requests get tags (``None``: none)."""
        self._warned: set[str] = set()
        self.recorder = TraceRecorder(self.config.trace_path) if self.config.trace_path else None
        self._stats = AdapterStats()
        self._lock = threading.Lock()
        self._runs: dict[UUID, _Run] = {}
        self._roots: dict[UUID, _Root] = {}
        # root graph/retriever run -> a weak reference to the run id object LangChain holds
        self._started: dict[UUID, weakref.ref[UUID]] = {}
        self._let_go: deque[UUID] = deque()  # roots whose id object died (weakref callbacks)
        with _HANDLERS_LOCK:
            _HANDLERS.add(self)
        self._live: dict[UUID, _Live] = {}
        self._queries: dict[str, _Query] = {}
        self._finished: OrderedDict[str, _Query] = OrderedDict()
        self._open_calls: OrderedDict[UUID, None] = OrderedDict()  # calls outside a graph
        self._warned_open = False

    def __deepcopy__(self, memo: dict[int, Any]) -> AgentSpecCallbackHandler:
        """The handler itself: a deep copy of a wrapped app (``copy.deepcopy``) shares it,
        as it shares the engine the handler sends to; its state is per run, so the copies'
        runs are tagged and counted apart (a lock cannot be copied)."""
        return self

    # ------------------------------------------------------------------ public
    @property
    def stats(self) -> AdapterStats:
        """A snapshot of the counters."""
        with self._lock:
            return replace(self._stats)

    def graph(self, query_id: str) -> RedundancyGraph:
        """A copy of the redundancy graph of ``query_id`` (live or recently finished)."""
        with self._lock:
            query = self._queries.get(query_id) or self._finished.get(query_id)
            if query is None:
                raise KeyError(f"no redundancy graph for query {query_id!r}")
            return query.graph.copy()

    def graphs(self) -> dict[str, RedundancyGraph]:
        """Copies of every graph held (live queries first, then finished ones)."""
        with self._lock:
            both = {**self._queries, **self._finished}
            return {qid: q.graph.copy() for qid, q in both.items()}

    def tags_for_call(self, run_id: UUID) -> StructureTags | None:
        """The tags of a live LLM call by its run id."""
        with self._lock:
            live = self._live.get(run_id)
            return None if live is None else live.tags

    def ticket_for_call(self, run_id: UUID) -> CallTicket | None:
        """The :class:`~agentspec_mw_langgraph.context.CallTicket` of a live LLM call by
        its run id (a layer that sends :meth:`tags_for_call` marks it delivered)."""
        with self._lock:
            live = self._live.get(run_id)
            return None if live is None else live.ticket

    def live_state(self) -> dict[str, int]:
        """Sizes of the per-run state (all zero when no run is in flight)."""
        with self._lock:
            self._drop_let_go()
            return {"runs": len(self._runs), "roots": len(self._roots), "calls": len(self._live)}

    def close(self) -> None:
        """Flush and close the trace recorder, if any (a later call's record reopens it,
        appending)."""
        if self.recorder is not None:
            self.recorder.close()

    # ------------------------------------------------------------ error policy
    def _failed(self, where: str, exc: BaseException) -> None:
        if self.raise_error:
            raise exc
        with self._lock:
            self._stats.adapter_errors += 1
        lost = (
            "continuing without tags for this call"
            if where == "tagging an LLM call"
            else "the call goes on; the redundancy graph or the trace record may miss this event"
        )
        _log.warning("agentspec: %s failed (%s: %s); %s", where, type(exc).__name__, exc, lost)

    # ------------------------------------------------------------------ runs
    def _register(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str | None,
        md: Mapping[str, Any],
        *,
        graph_run: bool = False,
        watch: bool = False,
    ) -> _Run | None:
        """Record a run; ``None`` if it was already seen. Caller holds the lock.

        A root ``graph_run`` (a chain run: a graph invocation) with a thread holds that
        thread's query while it runs, from its first child run on (:meth:`_settle`); one
        that finds another graph run holding it is a query of its own (concurrent runs
        given one ``thread_id`` never share groups, relations or learned segments). Roots
        that are LLM, tool or retriever runs join the thread's query (a handler given to
        the model only sees each call as a root).

        A root run whose end event releases it (``watch``: a chain or retriever run) is
        kept under a copy of its id and dropped once LangChain lets the id go without an
        end (:meth:`_watch`).
        """
        self._drop_let_go()
        held = self._started.get(run_id)
        if held is not None and held() is not run_id:
            # an equal id while the state kept under it is a start that never completed
            # whose id object someone still holds (a caller retrying with an equal id):
            # that state goes, this run starts afresh (the same handler seen twice gets
            # the same object, and stays a duplicate)
            self._release(run_id, ran=False)
        if run_id in self._runs:
            self._stats.duplicate_events += 1
            return None
        parent = self._runs.get(parent_run_id) if parent_run_id is not None else None
        if parent is None:
            if self._nested_elsewhere(parent_run_id):
                return None
            if watch:
                run_id = self._watch(run_id)
            root = run_id
            thread = md.get("thread_id")
            use_thread = self.config.tags_query_from_thread
            query_id = _bounded(derive.query_id_for(str(run_id), thread, use_thread))
            state = _Root(query_id=query_id, thread_id=thread)
            self._roots[root] = state
            if graph_run and query_id != _bounded(f"run:{run_id}"):
                state.opened = False  # the thread is claimed at its first child run
            else:
                self._open_root(root, state)
        else:
            root = parent.root
            state = self._roots[root]
            if not state.opened:
                self._settle(root, state)
        node = md.get("langgraph_node")
        is_node = node is not None and name == node
        run = _Run(
            root=root,
            parent=parent_run_id if parent is not None else None,
            node=str(node) if is_node else None,
            step=md.get("langgraph_step") if is_node else None,
            namespace=str(md.get("langgraph_checkpoint_ns", "")) if is_node else "",
            push_index=_push_index(md.get("langgraph_path")) if is_node else None,
            run_id=run_id,
            task_call=is_node and _is_task_call(md.get("langgraph_path")),
        )
        self._runs[run_id] = run
        self._roots[root].run_ids.add(run_id)
        return run

    def _watch(self, run_id: UUID) -> UUID:
        """A copy of root run id ``run_id`` to key its state by, and a weak reference to
        the object itself: LangChain's run manager for the run holds it (and its child
        runs' managers, as their parent id) for as long as the run may send events, and
        a start that never completed (rejected by another handler, failed here under
        ``raise_error``, cancelled) made no run manager. When it dies without an end event
        the run's state is dropped at the next event (:meth:`_drop_let_go`). Caller holds
        the lock."""
        if not isinstance(run_id, UUID):  # a caller's ``run_id`` LangChain passed as is
            return run_id
        own = UUID(int=run_id.int)
        let_go = self._let_go  # not self: the callback must not keep the handler alive
        try:  # the callback may run anywhere (even under this lock): it only appends
            self._started[own] = weakref.ref(run_id, lambda _: let_go.append(own))
        except TypeError:  # not weakly referenceable (a UUID subclass with slots)
            return run_id
        return own

    def _drop_let_go(self) -> None:
        """Drop the state of every root run whose id LangChain let go without its end
        event: its start never completed. Caller holds the lock."""
        while self._let_go:
            root = self._let_go.popleft()
            if self._started.pop(root, None) is not None:  # else it ended meanwhile
                self._release(root, ran=False)

    def _open_root(self, root: UUID, state: _Root) -> None:
        """Open (or join) the query of root run ``root``. Caller holds the lock."""
        query = self._open_query(state.query_id, root)
        # a re-run of a failed root's tasks: their attempts are retried
        state.attempts = query.failed_attempts
        query.failed_attempts = {}
        state.opened = True

    def _settle(self, root: UUID, state: _Root) -> None:
        """At a threaded graph run's first child run: claim its thread's query, or (another
        graph run holds it) make it a query of its own, and open that query. Caller holds
        the lock.

        Not at the run's start: a start another handler rejects (``raise_error``; LangChain
        then sends no end event, and the graph never runs) would hold the thread for the
        life of the handler, and every later run of the thread would be a query apart."""
        key = (self.config.tags_scope, state.query_id)
        if _claim_thread(key, self, root):
            state.thread = key
        else:
            state.query_id = _bounded(
                derive.query_id_for(str(root), state.thread_id, True, thread_busy=True)
            )
        self._open_root(root, state)

    def _nested_elsewhere(self, parent_run_id: UUID | None) -> bool:
        """Whether a run whose parent this handler does not know runs inside a run another
        live handler tracks (an outer wrapped app's): then that handler tags it. Reads the
        other handlers' run tables without their locks (one dict lookup each)."""
        if parent_run_id is None:
            return False
        with _HANDLERS_LOCK:  # a snapshot: other threads create handlers meanwhile
            handlers = list(_HANDLERS)
        return any(h is not self and parent_run_id in h._runs for h in handlers)

    def _open_query(self, query_id: str, root: UUID) -> _Query:
        """The state of query ``query_id``, which root run ``root`` starts or joins. A new
        one counts its calls from 0 under a trace run id of its own: the query id, plus
        the root run that opened it when the query id does not name that run (a thread's
        query: its state goes when the thread leaves ``graph_history``, and another
        handler or process may append the same thread's calls to the same file), so no
        two recordings share a ``(run_id, call_index)``."""
        query = self._queries.get(query_id) or self._finished.pop(query_id, None)
        if query is None:
            trace_run = query_id if str(root) in query_id else _bounded(f"{query_id}|run:{root}")
            query = _Query(
                graph=RedundancyGraph(query_id, self.config.graph_max_calls), trace_run=trace_run
            )
        query.active_roots += 1
        self._queries[query_id] = query
        return query

    def _release(self, run_id: UUID, failed: bool = False, ran: bool = True) -> None:
        """Drop a root's state when the root run ends (``failed``: with an error that is
        not an interrupt; not ``ran``: its start never completed, and a query it leaves
        with no call is not kept). A call still open is ended as failed (cancelled: no end
        event will come). Caller holds the lock."""
        self._open_calls.pop(run_id, None)
        self._started.pop(run_id, None)
        root = self._roots.pop(run_id, None)
        if root is None:
            return
        if root.thread is not None:
            _free_thread(root.thread, run_id)
        for rid in root.run_ids:
            self._runs.pop(rid, None)
            live = self._live.pop(rid, None)
            if live is not None:
                if live.call.status == "running":
                    live.call.status = "error"
                if live.ticket is not None:
                    live.ticket.end()
        if not root.opened:  # a graph run that never ran a child: it opened no query
            return
        query = self._queries.get(root.query_id)
        if query is None:
            return
        if failed:  # the attempts of the tasks that failed, not of those interrupted (a
            # handler given to the model only sees no node run: all of its attempts)
            query.failed_attempts.update(
                (key, attempt)
                for key, attempt in root.attempts.items()
                if any(rid is None or rid in root.failed_runs for rid, _ in attempt.levels)
            )
        query.active_roots -= 1
        if query.active_roots <= 0:
            del self._queries[root.query_id]
            if not ran and not query.graph.calls and not query.graph.dropped:
                return  # a run that never started: no graph to keep
            self._finished[root.query_id] = query
            while len(self._finished) > self.config.graph_history:
                self._finished.popitem(last=False)

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            with self._lock:
                self._register(
                    run_id,
                    parent_run_id,
                    kwargs.get("name"),
                    metadata or {},
                    graph_run=True,
                    watch=True,
                )
        except Exception as exc:  # noqa: BLE001 - the error policy
            self._failed("on_chain_start", exc)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            with self._lock:
                self._release(run_id)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_chain_end", exc)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            with self._lock:
                failed = not _is_interrupt(error)
                run = self._runs.get(run_id)
                root = self._roots.get(run.root) if run is not None else None
                if failed and run is not None and run.node is not None and root is not None:
                    root.failed_runs.add(run_id)
                self._release(run_id, failed=failed)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_chain_error", exc)

    # ------------------------------------------------------------- LLM calls
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        prompt = list(messages[0]) if messages else []
        self._start_llm(serialized, prompt, run_id, parent_run_id, metadata, kwargs)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        prompt = prompts[0] if prompts else ""
        self._start_llm(serialized, prompt, run_id, parent_run_id, metadata, kwargs)

    def _start_llm(
        self,
        serialized: dict[str, Any] | None,
        prompt: Sequence[BaseMessage] | str,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: dict[str, Any] | None,
        kwargs: Mapping[str, Any],
    ) -> None:
        md: Mapping[str, Any] = metadata or {}
        with self._lock:
            duplicate = run_id in self._live or run_id in self._runs
        if duplicate:  # the same handler registered twice: the first event did the work
            with self._lock:
                self._stats.duplicate_events += 1
            return
        if parent_run_id not in self._runs and self._nested_elsewhere(parent_run_id):
            return  # an outer app's handler tags it
        try:
            self._end_cancelled()
        except Exception as exc:  # noqa: BLE001
            self._failed("ending a cancelled LLM call", exc)
        try:
            self._drop_unfinished(parent_run_id)
        except Exception as exc:  # noqa: BLE001
            self._failed("dropping an unfinished LLM call", exc)
        # a call made during another's generation (a model calling a model) replaces that
        # call's tags in this context until it ends, then gives them back
        previous = current_call()
        set_current_tags(None)
        batch_size = kwargs.get("batch_size")
        # a batch starts all its calls before any runs: one ContextVar cannot carry them
        batched = isinstance(batch_size, int) and batch_size > 1
        with self._lock:
            self._stats.llm_calls += 1
        try:
            tags, fanout = self._tag_call(serialized, prompt, run_id, parent_run_id, md, kwargs)
        except Exception as exc:  # noqa: BLE001 - the error policy: no tags for this call
            with self._lock:
                if run_id in self._roots:  # a call outside a graph: nothing will end it
                    self._release(run_id)
            self._failed("tagging an LLM call", exc)
            return
        key = tags_routing_key(tags, self.config.routing_granularity, fanout=fanout)
        headers = {} if key is None else {self.config.routing_header: key}
        # an ended ticket reads as ``previous`` in contexts its end event did not reach
        ticket = CallTicket(
            self.engine_url, self._count_delivered, headers=headers, previous=previous
        )
        with self._lock:
            live = self._live.get(run_id)
            if live is not None:
                live.ticket = ticket
                live.task = _current_task()
            overflow = []
            while len(self._open_calls) > _MAX_OPEN_CALLS:  # oldest first
                overflow.append(self._open_calls.popitem(last=False)[0])
        try:
            for stale in overflow:
                self._abandon(stale, f"more than {_MAX_OPEN_CALLS} LLM calls outside a graph open")
        except Exception as exc:  # noqa: BLE001
            self._failed("dropping an unfinished LLM call", exc)
        if not batched:
            set_current_tags(tags, ticket)
            self._set_in_flight(run_id)
        # the run's own dict, which tracers read; the calls of a batch share one dict
        if isinstance(metadata, dict) and not batched:
            metadata.update(tags_to_wire(tags))

    def _end_cancelled(self) -> None:
        """End, as failed, every call whose asyncio task was cancelled without its end event
        (LangChain sends none for a cancelled call). A task that finished otherwise may
        have started a call that runs on: a stream whose first chunk was awaited in a task
        of its own (``asyncio.wait_for`` on Python 3.11, ``create_task(anext(...))``)."""
        with self._lock:
            gone = [
                rid for rid, lv in self._live.items() if lv.task is not None and lv.task.cancelled()
            ]
        for rid in gone:
            self._end_llm(rid, None, asyncio.CancelledError())

    def _set_in_flight(self, run_id: UUID | None) -> None:
        """Record (``None``: forget) the LLM call this handler started in this context."""
        calls = dict(_IN_FLIGHT.get() or {})
        if run_id is None:
            calls.pop(id(self), None)
        else:
            calls[id(self)] = run_id
        _IN_FLIGHT.set(calls or None)

    def _drop_unfinished(self, parent_run_id: UUID | None) -> None:
        """End, as failed, the call outside any graph run started last in this context if
        its start was rejected by another handler, so LangChain will send it no end event:
        it is still open, the new call is not made inside it, and no token of it arrived
        and no request layer used its ticket (a stream still being consumed while another
        call is made keeps running). (A call of a graph run is released with its root run;
        a model calling another model in its generation, under the node's config, must not
        lose its call.)"""
        previous = (_IN_FLIGHT.get() or {}).get(id(self))
        if previous is None:
            return
        with self._lock:
            live = self._live.get(previous)
            if live is None or live.root != previous:
                return
            ticket = live.ticket
            if live.streamed or (ticket is not None and (ticket.delivered or ticket.missed)):
                return  # it runs: not rejected
            cursor = parent_run_id
            while cursor is not None:
                if cursor == previous:  # a call made inside the open call: it is running
                    return
                parent = self._runs.get(cursor)
                cursor = parent.parent if parent is not None else None
        self._set_in_flight(None)
        self._abandon(previous, "an LLM call started before in this context never ended")

    def _abandon(self, run_id: UUID, why: str) -> None:
        """End a call no end event will come for (recorded as failed)."""
        if not self._warned_open:
            self._warned_open = True
            _log.warning(
                "agentspec: %s; dropping it as failed (a call whose start another "
                "callback handler rejected gets no end event)",
                why,
            )
        self._end_llm(run_id, None, _Abandoned(why))

    def _count_delivered(self) -> None:
        with self._lock:
            self._stats.tags_delivered += 1

    def _warn_missed(self, ticket: CallTicket) -> None:
        """Warn once per server when a call's OpenAI requests left without its tags."""
        if ticket.delivered:
            return
        for key, url in ticket.missed.items():
            if key.startswith(_OPENAI_API):  # the OpenAI API itself: tags are not for it
                continue
            with self._lock:
                if key in self._warned:
                    continue
                self._warned.add(key)
            _log.warning(
                "agentspec: tags not sent: a call of this graph requested %s, which is not "
                "the engine= given to with_agentspec (%r). If that is a vLLM server running "
                "AgentSpec, pass with_agentspec(graph, engine=%r).",
                url,
                self.engine,
                url,
            )

    def _tag_call(
        self,
        serialized: dict[str, Any] | None,
        prompt: Sequence[BaseMessage] | str,
        run_id: UUID,
        parent_run_id: UUID | None,
        md: Mapping[str, Any],
        kwargs: Mapping[str, Any],
    ) -> tuple[StructureTags, str | None]:
        """The call's tags and its fan-out's routing group (``None``: not in a fan-out)."""
        params: Mapping[str, Any] = kwargs.get("invocation_params") or {}
        ids = (serialized or {}).get("id") or []
        model_name = str(kwargs.get("name") or (ids[-1] if ids else "") or "llm")
        is_messages = not isinstance(prompt, str)
        last = prompt[-1] if is_messages and prompt else None
        after_tool = is_tool_result(last) if isinstance(last, BaseMessage) else False
        wire_prompt: list[dict[str, Any]] | str = (
            to_openai_messages(prompt) if not isinstance(prompt, str) else prompt
        )
        trailing = trailing_tool_call_ids(prompt) if not isinstance(prompt, str) else []
        with self._lock:
            # only the thread of the metadata: a call is no node run, even when the
            # handler was given to the model alone (its metadata names the node)
            run = self._register(run_id, parent_run_id, None, {"thread_id": md.get("thread_id")})
            assert run is not None  # duplicates were filtered by the caller
            if run.root == run_id:  # outside any graph run: bounded, see _start_llm
                self._open_calls[run_id] = None
            root = self._roots[run.root]
            query = self._queries[root.query_id]
            # the step template: node runs from the outermost graph to this call
            levels: list[_Run] = []
            cursor = run.parent
            while cursor is not None and cursor in self._runs:
                parent = self._runs[cursor]
                # a subgraph compiled with its node's name looks like a second node run
                # with the same namespace: one level, the outer (node) run
                if parent.node is not None:
                    if levels and levels[-1].namespace == parent.namespace:
                        levels[-1] = parent
                    else:
                        levels.append(parent)
                cursor = parent.parent
            levels.reverse()
            from_metadata = not levels and md.get("langgraph_node") is not None
            if from_metadata:  # the handler saw no node run (given to the model only)
                levels = [
                    _Run(
                        root=run.root,
                        parent=None,
                        node=str(md["langgraph_node"]),
                        step=md.get("langgraph_step"),
                        namespace=str(md.get("langgraph_checkpoint_ns", "")),
                        push_index=_push_index(md.get("langgraph_path")),
                        task_call=_is_task_call(md.get("langgraph_path")),
                    )
                ]
            inner = levels[-1] if levels else None
            node_run = None
            if inner is not None and not from_metadata:
                cursor = run.parent
                while cursor is not None and self._runs[cursor] is not inner:
                    cursor = self._runs[cursor].parent
                node_run = cursor
            node = inner.node if inner else None
            namespace = inner.namespace if inner else ""
            agent_id = derive.agent_from_namespace(namespace, node, model_name)
            # a middleware's own model call (a summary, a tool selection) in a node is not
            # that node's agent speaking: an agent of its own
            source = derive.internal_call_source(md)
            if source is not None:
                agent_id = f"{agent_id}/{source}"
            agent_id = _bounded(agent_id)
            template = tuple((lv.node or "", lv.step) for lv in levels)
            free = root.free_ordinals.get(node_run)
            if free:  # a failed call's ordinal: the smallest first
                ordinal = min(free)
                free.discard(ordinal)
            else:
                ordinal = root.ordinals.get(node_run, 0)
                root.ordinals[node_run] = ordinal + 1
            segment = derive.predict_segment(
                node=node,
                tools_bound=bool(params.get("tools")),
                tool_choice=params.get("tool_choice"),
                last_is_tool_result=after_tool,
                previous_after_tool=query.after_tool.get(agent_id),
                overrides=self.config.tags_segment_by_node,
            )
            call = CallNode(
                call_id=str(run_id),
                kind="llm",
                agent_id=agent_id,
                node=node,
                step=inner.step if inner else None,
                template=template,
                namespace=namespace,
                ordinal=ordinal,
                segment=segment,
                name=model_name,
                send_index=inner.push_index if inner else None,
            )
            graph = query.graph
            graph.add_call(call)
            qid = root.query_id
            # the fan-out ids' step template also counts each level's graph invocation: the
            # tasks of a subgraph a node runs twice take the same steps in both runs (the
            # superstep id does not: invocations of a batch run in one superstep)
            runs = [_invocation(lv.namespace) for lv in levels]
            pieces = [f"{n}@{s}{inv}" for (n, s), inv in zip(template, runs, strict=True)]
            tmpl = "/".join(pieces)
            # relations: all of them in the graph; on the tags only the fan-out group. A
            # node's retries and repeats are the same agent in the same query, so they share
            # the proposer's (agent, query) key with its first call: a group id of their own,
            # known only from the second call on, would split that key in two.
            group: tuple[str, Any] | None = None
            fanout: str | None = None  # the fan-out's routing group: see routing.py
            # keyed by steps, not the namespace: a retried subgraph's inner tasks get new ids
            attempt_key = (tuple((lv.node, lv.step, lv.push_index) for lv in levels), ordinal)
            found = root.attempts.get(attempt_key) if inner else None
            if found is not None and not _is_retry(found, levels):
                found = None
            previous_attempt = found.call if found is not None else None
            first_ns = found.first_namespace if found is not None else namespace
            if previous_attempt is not None:
                gid = _bounded(f"{qid}|retry|{first_ns}#{ordinal}")
                graph.join(gid, "retry", previous_attempt)
                graph.join(gid, "retry", call.call_id)
                graph.link(previous_attempt, call.call_id, "retry")
            if inner is not None:
                marks = tuple((lv.run_id, lv.namespace) for lv in levels)
                root.attempts[attempt_key] = _Attempt(call.call_id, first_ns, marks)
            path = "/".join(
                lv.node + ("" if lv.push_index is None else f"[{lv.push_index}]")
                for lv in levels
                if lv.node
            )
            # a middleware's own calls are an instance apart from its node's agent
            instance = (f"{path}/{source}" if source is not None else path) if path else agent_id
            pushed = [i for i, lv in enumerate(levels) if lv.push_index is not None]
            follows: str | None = None  # the call this one's turn continues
            run_ns: str | None = None  # a functional @task run's namespace
            if pushed:
                position = f"{qid}|fanout|{tmpl}"
                task_run = levels[pushed[-1]]
                if task_run.task_call:  # a functional @task: its round at the position
                    prefix = "/".join(
                        f"{lv.node}[{lv.push_index}]" if lv.push_index is not None else lv.node
                        for lv in levels[: pushed[-1] + 1]
                        if lv.node
                    )
                    turn = query.runs_round.get(task_run.namespace)
                    carried_calls: list[str] = []
                    if turn is None:
                        rnd, carried, carried_calls = _round_of(
                            query, position, task_run.namespace, prompt
                        )
                        # a run that continues another's agent is that instance at the
                        # task level (its subgraph nodes and middleware sources its own)
                        start = carried.prefix if carried is not None else prefix
                        turn = _Turn(position, rnd, task_run.namespace, start)
                    # the run's round is its agent's: a middleware's own call (a summary
                    # made first) does not fix it
                    if source is None or task_run.namespace in query.runs_round:
                        _remember(query.runs_round, task_run.namespace, turn)
                    if instance.startswith(prefix):
                        instance = turn.prefix + instance[len(prefix) :]
                    # it continues the last call of its instance the prompt carries
                    for carried_id in carried_calls:
                        known = query.calls_round.get(carried_id)
                        if known is not None and known[1] == instance:
                            follows = carried_id
                    _remember(query.calls_round, call.call_id, (turn, instance))
                    run_ns = task_run.namespace
                    if turn.round:
                        position += f"~{turn.round}"
                # bounded before the ordinal, so that a group id of the whole still holds it
                suffix = f"#{ordinal}"
                gid = _bounded(position, MAX_ID_CHARS - len(suffix)) + suffix
                graph.join(gid, "fanout", call.call_id)
                group = (gid, "fanout")
                # the fan-out itself: its template up to the level its siblings were pushed
                # at, so a sibling's calls at any inner step or position (or round) share
                # its key
                fanout = _bounded(f"{qid}|fanout|{'/'.join(pieces[: pushed[-1] + 1])}")
            if inner is not None:  # same superstep at every graph level: parallel agents
                steps = "/".join(str(s) for _, s in template)
                graph.join(_bounded(f"{qid}|superstep|{steps}"), "superstep", call.call_id)
            # the node run whose concurrent calls are siblings: outside a graph none; a
            # handler given to the model only sees no node run, but its task's namespace
            scope: object = node_run
            if node_run is None and inner is not None:
                scope = namespace or None
            previous = self._place_call(query, instance, scope, call.call_id)
            if follows is not None:  # a functional @task's turn: it continues that call
                previous = follows
            elif run_ns is not None and previous is not None:
                # runs that continue one agent together (refinements of one draft) share
                # its instance: a later call of a run repeats its own run's call
                known = query.calls_round.get(previous)
                own = query.runs_last.get(f"{run_ns}\x1f{instance}")
                if own is not None and (known is None or known[0].run != run_ns):
                    previous = own
            if run_ns is not None:
                _remember(query.runs_last, f"{run_ns}\x1f{instance}", call.call_id)
            if previous is not None and previous_attempt is None:
                gid = _bounded(f"{qid}|repeat|{instance}")
                graph.join(gid, "repeat", previous)
                graph.join(gid, "repeat", call.call_id)
                graph.link(previous, call.call_id, "repeat")
            for tool_call_id in trailing:
                obs = query.observations.get(tool_call_id)
                if obs is not None:
                    graph.link(obs, call.call_id, "observation")
            if group is not None:
                call.group_id, call.group_kind = group[0], group[1]
            tags = StructureTags(
                scope=self.config.tags_scope,
                agent_id=agent_id,
                query_id=qid,
                segment=segment,
                blocks=derive.blocks_for(params, self.config.tags_blocks),
                group_id=call.group_id,
                group_kind=call.group_kind,
            )
            self._live[run_id] = _Live(
                root=run.root,
                node_run=node_run,
                call=call,
                query_id=qid,
                tags=tags,
                call_index=query.next_call_index,
                trace_run=query.trace_run,
                after_tool=after_tool,
                prompt=wire_prompt,
                model=str(params.get("model") or params.get("model_name") or model_name),
                started=time.time(),
            )
            query.next_call_index += 1
            self._stats.tags_derived += 1
            return tags, fanout

    @staticmethod
    def _place_call(query: _Query, instance: str, scope: object, call_id: str) -> str | None:
        """Record a new call of ``instance`` made in node run ``scope`` and return the call
        it repeats, if any. Caller holds the lock.

        A call that starts while a call of the same node run's current batch is still
        running joins that batch (its ``parallel`` group) and repeats what the batch's
        first call repeats: none of them followed another. Any other call starts a new
        batch and repeats the last call of the instance to start (after a batch: its
        last call to start, the order in which the node issued them)."""
        graph = query.graph
        state = query.instances.get(instance)
        if state is None:
            query.instances[instance] = _Instance(
                last=call_id, before=None, first=call_id, scope=scope, running=deque([call_id])
            )
            return None
        running = state.running
        if scope is not None and state.scope == scope:
            while running and getattr(graph.calls.get(running[0]), "status", None) != "running":
                running.popleft()  # ended (or not kept by the graph)
        if scope is None or state.scope != scope or not running:  # a new batch
            state.before, state.first, state.scope = state.last, call_id, scope
            state.running = deque([call_id])
        else:  # a concurrent sibling
            gid = _bounded(f"{graph.query_id}|parallel|{state.first}")
            graph.join(gid, "parallel", state.first)
            graph.join(gid, "parallel", call_id)
            running.append(call_id)
        state.last = call_id
        return state.before

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """A streamed call's usage chunk gets the speculation stats its response carried
        (a server reports them on that chunk; they reach the merged message with it)."""
        live = self._live.get(run_id)  # one atomic dict read: the per-token path takes no lock
        if live is not None and not live.streamed:
            live.streamed = True
        message = getattr(chunk, "message", None)
        if getattr(message, "usage_metadata", None) is None:  # the per-token fast path
            return
        try:
            with self._lock:
                live = self._live.get(run_id)
            ticket = live.ticket if live is not None else None
            stats = ticket.spec_decoding if ticket is not None else None
            metadata = getattr(message, "response_metadata", None)
            if stats is not None and isinstance(metadata, dict):
                metadata.setdefault(SPEC_DECODING_KEY, stats)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_llm_new_token", exc)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            self._end_llm(run_id, response, None)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_llm_end", exc)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            self._end_llm(run_id, None, error)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_llm_error", exc)

    def _end_llm(
        self, run_id: UUID, response: LLMResult | None, error: BaseException | None
    ) -> None:
        if (_IN_FLIGHT.get() or {}).get(id(self)) == run_id:
            self._set_in_flight(None)
        with self._lock:
            live = self._live.pop(run_id, None)
            if live is None:
                return
            # give back what it replaced (a calling model's tags, or none) only where its
            # own are current: not where it ends elsewhere (an async call's end event task,
            # an astream closed by the event loop's finaliser; there the ended ticket reads
            # as what it replaced) or where another call's tags replaced its own
            restore = live.ticket is not None and current_ticket() is live.ticket
            if live.ticket is not None:  # its tags are no longer current in any context
                live.ticket.end()
                if restore:
                    set_current_tags(*live.ticket.previous)
            text: str | None = None
            try:
                call = live.call
                root = self._roots.get(live.root)
                query = self._queries.get(live.query_id)
                if error is not None or response is None:
                    call.status = "error"
                    if root is not None:  # a failed attempt does not take an ordinal
                        root.free_ordinals.setdefault(live.node_run, set()).add(call.ordinal)
                else:
                    call.status = "ok"
                    first = response.generations[0] if response.generations else None
                    gen = first[0] if first else None
                    message = getattr(gen, "message", None)
                    calls = has_tool_calls(message)  # invalid ones too: still a call
                    # a functional @task call's reply, for the rounds (only those: the
                    # digest is not made for other calls)
                    mine = query.calls_round.get(call.call_id) if query is not None else None
                    key = (
                        _reply_key(message)
                        if mine is not None and isinstance(message, BaseMessage)
                        else None
                    )
                    if query is not None and mine is not None and key is not None:
                        # a reply another task run gave too (a cached answer, a model
                        # that sets ids) is ambiguous: "" matches no call; a re-run of
                        # the same task (a resume, a retry) keeps it
                        known = query.replies.get(key)
                        other = query.calls_round.get(known) if known else None
                        same = known is None or (other is not None and other[0].run == mine[0].run)
                        _remember(query.replies, key, call.call_id if same else "")
                    call.actual_segment = derive.actual_segment(call.segment, calls)
                    if live.after_tool and query is not None:
                        query.after_tool[call.agent_id] = call.actual_segment
                    text = (
                        output_text(message) if message is not None else (gen.text if gen else "")
                    )
            finally:  # whatever failed above, a call outside any graph run is its own root
                if live.root == run_id:
                    self._release(run_id)
        if live.ticket is not None:
            self._warn_missed(live.ticket)
            if response is not None and error is None:
                _attach_spec_decoding(response, live.ticket)
        if text is not None and self.recorder is not None:
            record = self._trace_record(live, text)  # a failure: on_llm_end's, logged
            if self.recorder.record(record):
                with self._lock:
                    self._stats.traces_recorded += 1

    def _trace_record(self, live: _Live, output: str) -> TraceRecord:
        """The trace record of an ended call. Text that is not valid Unicode (a lone
        surrogate, which the record refuses) is recorded with U+FFFD in its place, logged."""
        call = live.call
        fields, repaired = _valid_unicode(
            {
                "workload": self.config.trace_workload,
                "source": _TRACE_SOURCE,
                "run_id": live.trace_run,
                "call_index": live.call_index,
                "agent": call.agent_id,
                "segment_hint": call.segment or "other",
                "parent_group": call.group_id,
                "prompt": live.prompt,
                "output": output,
                "meta": {
                    "step": call.step,
                    "node": call.node,
                    "namespace": call.namespace,
                    "template": [list(t) for t in call.template],
                    "group_kind": call.group_kind,
                    "actual_segment": call.actual_segment,
                    "model": live.model,
                    "call_id": call.call_id,
                    "query_id": live.query_id,
                    # wall clock (s): the replay issues a call with the one before it only
                    # if it started before that one ended
                    "started": live.started,
                    "ended": time.time(),
                },
            }
        )
        if repaired:
            _log.warning(
                "agentspec: the trace record of LLM call %s (agent %r) held lone surrogates "
                "(text that is not valid Unicode, such as half of an emoji); recorded with "
                "each replaced by U+FFFD",
                call.call_id,
                fields["agent"],
            )
        return TraceRecord(**fields)

    # ----------------------------------------------------------------- tools
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            with self._lock:
                run = self._register(run_id, parent_run_id, None, {})
                if run is None or run.root == run_id:
                    if run is not None:  # a tool outside any graph run: not tracked
                        self._release(run_id)
                    return
                md = metadata or {}
                namespace = str(md.get("langgraph_checkpoint_ns", ""))
                node = md.get("langgraph_node")
                query = self._queries[self._roots[run.root].query_id]
                tool_call_id = kwargs.get("tool_call_id")  # LangChain passes it for a ToolCall
                run.tool_call_id = str(tool_call_id) if tool_call_id else None
                query.graph.add_call(
                    CallNode(
                        call_id=str(run_id),
                        kind="tool",
                        agent_id=derive.agent_from_namespace(namespace, node, "tool"),
                        node=node,
                        step=md.get("langgraph_step"),
                        template=(),
                        namespace=namespace,
                        ordinal=0,
                        segment="observation",
                        name=kwargs.get("name") or (serialized or {}).get("name"),
                    )
                )
        except Exception as exc:  # noqa: BLE001
            self._failed("on_tool_start", exc)

    def _end_tool(self, run_id: UUID, output: Any, status: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.root not in self._roots:
                return
            query = self._queries.get(self._roots[run.root].query_id)
            call = query.graph.calls.get(str(run_id)) if query else None
            if query is None or call is None or call.status != "running":
                return
            call.status = "ok" if status == "ok" else "error"
            # a tool that raised has no output; a ToolNode that handles the error still
            # feeds its message back under the call's id
            tool_call_id = getattr(output, "tool_call_id", None) or run.tool_call_id
            if tool_call_id:
                query.observations[str(tool_call_id)] = call.call_id
                while len(query.observations) > _MAX_OBSERVATIONS:  # oldest first
                    del query.observations[next(iter(query.observations))]

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            self._end_tool(run_id, output, "ok")
        except Exception as exc:  # noqa: BLE001
            self._failed("on_tool_end", exc)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            self._end_tool(run_id, None, "error")
        except Exception as exc:  # noqa: BLE001
            self._failed("on_tool_error", exc)

    # ------------------------------------------------------------ retrievers
    def on_retriever_start(
        self,
        serialized: dict[str, Any] | None,
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A retriever run: LLM calls made inside it belong to its graph run's query (one
        outside any graph run is a root of its own until it ends)."""
        try:
            with self._lock:
                self._register(run_id, parent_run_id, None, metadata or {}, watch=True)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_retriever_start", exc)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            with self._lock:
                self._release(run_id)  # a no-op unless the retriever is its own root
        except Exception as exc:  # noqa: BLE001
            self._failed("on_retriever_end", exc)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        try:
            with self._lock:
                self._release(run_id)
        except Exception as exc:  # noqa: BLE001
            self._failed("on_retriever_error", exc)
