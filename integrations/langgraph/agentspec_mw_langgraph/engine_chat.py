"""``ChatAgentSpecVLLM``: a LangChain chat model on the embedded vLLM engine.

Each request carries the structure tags of its call (set by the inline handler of
:func:`~agentspec_mw_langgraph.with_agentspec`, read by the call's run id, else from the
per-call ContextVar) as ``SamplingParams.extra_args``, so each prompt of a ``generate``
batch sends its own. Tool calling goes through the model's chat template in the Hermes
``<tool_call>`` format (:mod:`~agentspec_mw_langgraph.toolformat`; a block it cannot read
is an invalid tool call whose ``args`` is the whole block, tags included, so that streamed
chunks join to the same invalid call, not a valid one -- LangChain leaves the joined
call's ``error`` unset); ``bind_tools`` takes
LangChain tools, functions or OpenAI tool dicts, so the model works in ``create_agent``
and ``create_react_agent``. ``tool_choice`` ``"auto"`` (or none) offers the tools and the
model decides; ``"none"`` withholds them; ``"any"``, ``"required"``, ``True`` or a tool's
name force exactly one call of a bound tool (the named one), enforced by vLLM's structured
outputs; ``response_format`` (``ChatOpenAI``'s forms) constrains the output to JSON
(:mod:`~agentspec_mw_langgraph.constrain`). So ``with_structured_output`` (methods
``"function_calling"``, the default, ``"json_schema"`` and ``"json_mode"``) and
``create_agent(..., response_format=...)`` get parseable output even from a small model.

``engine`` may be a ``vllm.LLM`` (:class:`~.backend.VLLMBackend`), an ``AsyncLLM``
(:class:`~.async_backend.AsyncVLLMBackend`) or any :class:`~.backend.EngineBackend`.
Sync and async calls, streaming or not, work on both, from any thread or event loop.
Streaming yields text as the engine produces it, token by token (a possible
``<tool_call>`` start, and a line break before one, is held back; tool calls and the text
after the first block arrive in the last chunk, so the chunks join to the ``invoke``
message, but for edge whitespace). Concurrent calls
from parallel branches share engine steps: ``AsyncLLM`` batches them itself; a
``vllm.LLM`` is stepped by one engine loop thread (:mod:`~.batching`) that adds each
request at the next step. All model objects on one engine object share its backend.

``engine=None`` builds the embedded default on first use:
``agentspec_mw_vllm.engine.build_llm(model, speculative=..., k=..., max_model_len=...,
**engine_options)``; with ``share_engine=True`` (the default) model objects with equal
settings share one such engine per process (:mod:`~.shared`). Settings are equal when
they give ``vllm.LLM`` the same arguments (``agentspec_mw_vllm.engine.engine_kwargs``):
``model=None``, ``"default"`` and the default model's folder are one model, an option
given at its default is the option left out.

Each message's ``response_metadata["speculative_decoding"]`` holds the call's
``num_draft_tokens`` and ``num_accepted_draft_tokens`` when the engine reports them
(vLLM's per-request spec-decode metrics, on in ``build_llm`` engines that speculate).
A stream's last chunk carries them, with ``finish_reason``, the usage and the tool call
chunks; it is marked ``chunk_position="last"``, so LangChain appends no empty chunk after
it (``list(model.stream(...))[-1]`` is that chunk, in ``astream`` and a graph's
``stream_mode="messages"`` too).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import hashlib
import json
import threading
import warnings
from array import array
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.callbacks.manager import BaseRunManager
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCallChunk, tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agentspec_mw.default_model import (
    DEFAULT_MODEL_NAME,
    check_model,
    model_display_name,
    resolve_model,
)
from agentspec_mw.errors import MissingDependencyError
from agentspec_mw.registry import proposer_target
from agentspec_mw.tags import tags_to_wire
from agentspec_mw_langgraph.backend import (
    EngineBackend,
    GenerationRequest,
    GenerationResult,
    import_vllm,
)
from agentspec_mw_langgraph.constrain import output_constraint, parsed_response
from agentspec_mw_langgraph.context import deliver_wire_tags
from agentspec_mw_langgraph.derive import HERMES_TOOL_BLOCK
from agentspec_mw_langgraph.handler import AgentSpecCallbackHandler
from agentspec_mw_langgraph.messages import to_openai_messages
from agentspec_mw_langgraph.shared import backend_for, shared_engine
from agentspec_mw_langgraph.toolformat import (
    TOOL_CALL_BLOCKS,
    parse_tool_calls,
    render_chat_prompt,
)

__all__ = ["ChatAgentSpecVLLM"]


def _stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """Stop strings as a list: a string is one stop string, as ``ChatOpenAI`` takes it."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _call_wire_tags(run_manager: BaseRunManager | None) -> dict[str, str | int | float] | None:
    """The wire tags of the call ``run_manager`` runs, for a request about to be sent
    (records the delivery): an AgentSpec handler's tags for its run id, else the per-call
    ContextVar's (a call of a ``generate`` batch is only found by its run id)."""
    if run_manager is not None:
        run_id = run_manager.run_id
        for handler in run_manager.handlers:
            if isinstance(handler, AgentSpecCallbackHandler):
                tags = handler.tags_for_call(run_id)
                if tags is not None:
                    ticket = handler.ticket_for_call(run_id)
                    if ticket is not None:
                        ticket.mark_delivered()
                    return tags_to_wire(tags)
    return deliver_wire_tags()


class ChatAgentSpecVLLM(BaseChatModel):
    """A chat model on an in-process vLLM engine that forwards AgentSpec tags."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(default=None, exclude=True)
    """A ``vllm.LLM``, an :class:`~.backend.EngineBackend`, or ``None`` (build on first use)."""
    model: str | None = None
    """Model for the engine built when ``engine`` is ``None`` (``None``: the default model)."""
    speculative: str | None = "agentspec"
    """Speculation of the engine built when ``engine`` is ``None``."""
    k: int = Field(default=8, ge=1)
    """Draft tokens per step of the engine built when ``engine`` is ``None``."""
    max_model_len: int = Field(default=2048, ge=32)
    """Context limit of the engine built when ``engine`` is ``None``."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """More ``build_llm`` keyword arguments (e.g. ``max_num_seqs=32``) for that engine."""
    share_engine: bool = True
    """Share the engine built when ``engine`` is ``None`` with the other model objects of
    this process that have the same engine settings (``False``: build a private one)."""
    max_tokens: int = Field(default=256, ge=1)
    """Tokens to generate at most per call."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] | None = None
    """Stop strings (merged with the ``stop`` of each call; a string is one stop string)."""

    streaming: bool = False
    """``invoke`` streams from the engine and assembles the message (as ChatOpenAI's
    ``streaming``); ``stream``/``astream`` stream either way."""

    _backend: EngineBackend | None = PrivateAttr(default=None)
    _built_here: bool = PrivateAttr(default=False)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """A misspelt or foreign keyword (``model_name``, ``max_token``) is an error, not a
        silently ignored setting."""
        if isinstance(data, dict):
            fields = set(cls.model_fields)
            unknown = [key for key in data if isinstance(key, str) and key not in fields]
            if unknown:
                hints = []
                for key in unknown:
                    near = _FOREIGN_FIELDS.get(key) or next(
                        iter(difflib.get_close_matches(key, sorted(fields), n=1)), None
                    )
                    hints.append(f"{key!r}" + (f" (did you mean {near!r}?)" if near else ""))
                raise ValueError(
                    f"ChatAgentSpecVLLM got unknown keyword(s) {', '.join(hints)}; its settings "
                    f"are {', '.join(f for f in cls.model_fields if f not in _BASE_FIELDS)} "
                    "and BaseChatModel's (callbacks, tags, metadata, ...)"
                )
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_model(self) -> ChatAgentSpecVLLM:
        """A model the engine built on first use could not load, or a drafter name that is
        neither a builtin nor a dotted path, fails here, not seconds into the first call
        (:func:`agentspec_mw.default_model.check_model`,
        :func:`agentspec_mw.registry.proposer_target`), as do ``engine_options``'
        ``cost_model`` / ``proposer_options`` with a ``speculative`` that runs none of this
        project's proposers (``None``, ``"ngram"``, ``"suffix"``: refused, not ignored)."""
        if self.engine is None:
            check_model(self.model)
            if self.speculative is not None:
                proposer_target(self.speculative)
            _check_drafter_options(self.speculative, self.engine_options)
        return self

    @property
    def _llm_type(self) -> str:
        return "agentspec-vllm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """What makes this model's answers differ (LangChain's response cache keys on it):
        the model, the sampling settings (``model_stop``: the model's own stop strings) and
        the engine -- the settings of the one built on first use, else the given engine's
        model path and speculation."""
        return {
            "model": self.model_label,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "model_stop": self.stop,
            **self._engine_identity(),
            # read by the AgentSpec handler: the delimiters of this model's output format
            "agentspec_blocks": [list(b) for b in TOOL_CALL_BLOCKS],
        }

    def _engine_identity(self) -> dict[str, Any]:
        """The engine part of :attr:`_identifying_params` (the same before and after a
        first-use build)."""
        if self.engine is None or self._built_here:
            return {
                "speculative": self.speculative,
                "k": self.k,
                "max_model_len": self.max_model_len,
                "engine_options": repr(sorted(self.engine_options.items())),
            }
        backend = self.backend
        engine = getattr(backend, "llm", None) or getattr(backend, "engine", None)
        config = getattr(getattr(engine, "llm_engine", engine), "vllm_config", None)
        spec = getattr(config, "speculative_config", None)
        if spec is not None:  # vLLM's SpeculativeConfig: method and draft tokens per step
            spec = f"{getattr(spec, 'method', None)}:{getattr(spec, 'num_speculative_tokens', 0)}"
        return {
            "engine_model": backend.model_name,
            "speculative": spec,
            "engine_additional_config": repr(getattr(config, "additional_config", None)),
        }

    @property
    def backend(self) -> EngineBackend:
        """The engine backend (built on first use when ``engine`` is ``None``)."""
        with self._lock:
            if self._backend is None:
                engine = self.engine
                if engine is None:
                    try:
                        from agentspec_mw_vllm.engine import build_llm, engine_kwargs
                    except ImportError:
                        raise MissingDependencyError(
                            "agentspec-mw-vllm",
                            "the embedded engine of ChatAgentSpecVLLM",
                            "pip install agentspec-mw-vllm   (or: bash scripts/bootstrap.sh)",
                        ) from None
                    import_vllm()  # off this stack, which holds self (see import_vllm)

                    def build() -> Any:
                        return build_llm(
                            self.model,
                            speculative=self.speculative,
                            k=self.k,
                            max_model_len=self.max_model_len,
                            **self.engine_options,
                        )

                    if self.share_engine:
                        settings: dict[str, Any] = {
                            "model": self.model,
                            "speculative": self.speculative,
                            "k": self.k,
                            "max_model_len": self.max_model_len,
                            **self.engine_options,
                        }
                        # keyed on what vllm.LLM gets: equal settings spelled differently
                        # (model None / "default" / its folder, a default option given)
                        # share one engine; options build_llm refuses raise here
                        key = engine_kwargs(
                            self.model,
                            speculative=self.speculative,
                            k=self.k,
                            max_model_len=self.max_model_len,
                            **self.engine_options,
                        )
                        engine = shared_engine(settings, build, key=key)  # deep copies
                    else:
                        engine = build()
                    self.engine = engine
                    self._built_here = True
                self._backend = backend_for(engine)
            return self._backend

    async def _abackend(self) -> EngineBackend:
        """:attr:`backend` for async callers: a first-use engine build runs in a worker
        thread, so the event loop keeps running meanwhile."""
        if self._backend is not None:
            return self._backend
        return await asyncio.to_thread(lambda: self.backend)

    @property
    def model_label(self) -> str:
        """The model's name in ``response_metadata["model_name"]`` and LangSmith's
        ``ls_model_name``: ``model``, the default model's name, or a given engine's."""
        if self.model is not None:
            return self.model
        if self.engine is None or self._built_here:
            return DEFAULT_MODEL_NAME
        return model_display_name(self.backend.model_name)  # vLLM's: the folder it loaded

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "vllm"
        params["ls_model_name"] = self.model_label
        return params

    def _tokenizer(self) -> Any:
        """The engine's tokenizer; before an engine is built here, the same model's
        tokenizer loaded alone (counting tokens does not start an engine)."""
        if self._backend is not None or self.engine is not None:
            return self.backend.get_tokenizer()
        return _standalone_tokenizer(resolve_model(self.model))

    def get_token_ids(self, text: str) -> list[int]:
        """``text``'s token ids under the model's own tokenizer (no special tokens), or
        ``custom_get_token_ids``'s."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        return list(self._tokenizer().encode(text, add_special_tokens=False))

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage], tools: Sequence[Any] | None = None
    ) -> int:
        """Tokens of the prompt the engine gets for ``messages`` (and ``tools``): the
        model's chat template rendered as a call renders it, generation prompt included,
        so ``trim_messages(token_counter=model)`` keeps what fits ``max_model_len``
        (with ``custom_get_token_ids``: LangChain's per-message count over it)."""
        if self.custom_get_token_ids is not None:
            return super().get_num_tokens_from_messages(messages, tools)
        formatted = [convert_to_openai_tool(t) for t in tools] if tools else None
        tokenizer = self._tokenizer()
        text = render_chat_prompt(tokenizer, to_openai_messages(messages), formatted)
        return len(tokenizer.encode(text, add_special_tokens=False))

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """Offer ``tools`` (LangChain tools, functions, pydantic models or OpenAI dicts);
        ``tool_choice`` as in the module docstring.

        Raises:
            ValueError: ``tool_choice`` names a tool not in ``tools``, or is malformed.
        """
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            if tool_choice != "none":  # checked now, not at the first call
                output_constraint(formatted, tool_choice, kwargs.get("response_format"))
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """A runnable whose output is ``schema`` (a pydantic model, TypedDict, JSON schema
        or OpenAI tool dict), as LangChain's chat models take it.

        ``method="function_calling"`` (the default): the schema is offered as a tool and the
        model must call it (the schema is in the prompt; the call is enforced).
        ``"json_schema"``: the output is JSON valid against the schema, enforced (the
        schema is not in the prompt: describe the fields in it). ``"json_mode"``: any JSON
        object (the schema is neither in the prompt nor enforced). ``strict`` is accepted
        for compatibility: enforcement is always strict here.

        Raises:
            ValueError: an unknown ``method`` or keyword argument.
        """
        del strict
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        if method == "function_calling":
            return super().with_structured_output(schema, include_raw=include_raw)
        if method not in ("json_schema", "json_mode"):
            raise ValueError(
                f"method={method!r}: pass 'function_calling', 'json_schema' or 'json_mode'"
            )
        is_model = isinstance(schema, type) and is_basemodel_subclass(schema)
        fmt: dict[str, Any]
        if method == "json_mode":
            fmt = {"type": "json_object"}
        else:
            json_schema = convert_to_json_schema(schema)
            name = str(json_schema.get("title") or "response")
            fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": json_schema}}
        llm = self.bind(
            response_format=fmt,
            ls_structured_output_format={"kwargs": {"method": method}, "schema": schema},
        )
        parser: Runnable[Any, Any] = (
            PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
            if is_model
            else JsonOutputParser()
        )
        if not include_raw:
            return llm | parser
        with_parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        without = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | with_parsed.with_fallbacks(
            [without], exception_key="parsing_error"
        )

    def _request(
        self,
        messages: list[BaseMessage],
        stop: str | Sequence[str] | None,  # LangChain passes a call's str stop as is
        kwargs: dict[str, Any],
        run_manager: BaseRunManager | None = None,
    ) -> GenerationRequest:
        backend = self.backend
        tools = kwargs.get("tools") or None
        if kwargs.get("tool_choice") == "none":
            tools = None
        unknown = set(kwargs) - _REQUEST_KWARGS
        if unknown:
            _warn_ignored(unknown)
        constraint = output_constraint(
            tools,
            kwargs.get("tool_choice"),
            kwargs.get("response_format"),
            strict=kwargs.get("strict"),
            parallel_tool_calls=kwargs.get("parallel_tool_calls"),
        )
        tokenizer = backend.get_tokenizer()
        text = render_chat_prompt(tokenizer, to_openai_messages(messages), tools)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        return GenerationRequest(
            prompt_token_ids=ids,
            max_tokens=_option(
                "max_tokens",
                _first(kwargs.get("max_tokens"), kwargs.get("max_completion_tokens")),
                self.max_tokens,
                int,
            ),
            temperature=_option("temperature", kwargs.get("temperature"), self.temperature, float),
            top_p=_option("top_p", kwargs.get("top_p"), self.top_p, float),
            seed=kwargs.get("seed", self.seed),
            stop=tuple([*_stop_list(self.stop), *_stop_list(stop)]),
            extra_args=_call_wire_tags(run_manager),
            structured_outputs=constraint,
        )

    def _message(
        self, result: GenerationResult, request: GenerationRequest, response_format: Any = None
    ) -> AIMessage:
        prompt_tokens = len(request.prompt_token_ids)
        salt = hashlib.sha1(array("q", request.prompt_token_ids).tobytes()).hexdigest()
        content, calls, invalid = parse_tool_calls(result.text, salt)
        metadata: dict[str, Any] = {
            "finish_reason": result.finish_reason,
            "model_name": self.model_label,
        }
        if result.num_draft_tokens is not None:
            metadata["speculative_decoding"] = {
                "num_draft_tokens": result.num_draft_tokens,
                "num_accepted_draft_tokens": result.num_accepted_draft_tokens,
            }
        return AIMessage(
            content=content,
            additional_kwargs=parsed_response(response_format, str(content)) if not calls else {},
            tool_calls=calls,
            invalid_tool_calls=[_invalid_call(c) for c in invalid],
            response_metadata=metadata,
            usage_metadata={
                "input_tokens": prompt_tokens,
                "output_tokens": len(result.token_ids),
                "total_tokens": prompt_tokens + len(result.token_ids),
            },
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, kwargs, run_manager)
        (result,) = self.backend.generate([request])
        message = self._message(result, request, kwargs.get("response_format"))
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        agenerate = getattr(await self._abackend(), "agenerate", None)
        if agenerate is None:  # a sync-only backend: a worker thread, with this context
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        request = self._request(messages, stop, kwargs, run_manager)
        result = await agenerate(request)
        message = self._message(result, request, kwargs.get("response_format"))
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        astream = getattr(await self._abackend(), "astream", None)
        if astream is None:
            async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
                yield chunk
            return
        request = self._request(messages, stop, kwargs, run_manager)
        chunker = _DeltaChunker(self, request, kwargs.get("response_format"))
        async for kind, value in astream(request):
            for chunk in chunker.feed(kind, value):
                yield chunk

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs, run_manager)
        stream = getattr(self.backend, "stream", None)
        if stream is not None:  # the engine streams: pass its deltas on as they come
            chunker = _DeltaChunker(self, request, kwargs.get("response_format"))
            for kind, value in stream(request):
                yield from chunker.feed(kind, value)
            return
        (result,) = self.backend.generate([request])
        message = self._message(result, request, kwargs.get("response_format"))
        meta = dict(message.response_metadata)
        if message.tool_calls or message.invalid_tool_calls:
            yield ChatGenerationChunk(
                message=AIMessageChunk(
                    content=message.content,
                    tool_call_chunks=_call_chunks(message),
                    response_metadata=meta,
                    usage_metadata=message.usage_metadata,
                    chunk_position="last",
                )
            )
            return
        pieces = _token_pieces(self.backend.get_tokenizer(), list(result.token_ids))
        if "".join(pieces) != result.text:  # detokenization differs: one chunk, exact text
            pieces = [result.text]
        for piece in pieces[:-1]:
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        yield ChatGenerationChunk(
            message=AIMessageChunk(
                content=pieces[-1] if pieces else "",
                response_metadata=meta,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
        )


def _check_drafter_options(speculative: str | None, options: dict[str, Any]) -> None:
    """``build_llm``'s check of the proposer options in ``options``, at construction (none
    where the engine package is missing: the build reports that)."""
    if "cost_model" not in options and "proposer_options" not in options:
        return
    try:
        from agentspec_mw_vllm.engine import check_drafter_options
    except ImportError:
        return
    check_drafter_options(speculative, options.get("proposer_options"), options.get("cost_model"))


def _call_chunks(message: AIMessage) -> list[ToolCallChunk]:
    """``message``'s tool calls as the chunks of its last streamed piece: joined (LangChain
    re-parses each chunk's ``args``), they give the same calls and invalid calls (whose
    ``error`` LangChain leaves ``None``)."""
    chunks = [
        tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
        for i, c in enumerate(message.tool_calls)
    ]
    return chunks + [  # args of an invalid call: never a JSON object (see _invalid_call)
        tool_call_chunk(name=c["name"], args=c["args"], id=c["id"], index=i)
        for i, c in enumerate(message.invalid_tool_calls, start=len(chunks))
    ]


def _invalid_call(call: InvalidToolCall) -> InvalidToolCall:
    """An invalid call as the message carries it: ``args`` is the block, tags included
    (``<tool_call>``, the body, ``</tool_call>``, on lines of their own), as joined
    streamed chunks re-parse ``args`` and a bare body that reads as a JSON object would
    turn into a valid call."""
    open_tag, close_tag = HERMES_TOOL_BLOCK
    return {**call, "args": f"{open_tag}\n{call['args'] or ''}\n{close_tag}"}


def _token_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each token adds (a token ending inside a UTF-8 character adds nothing)."""
    pieces: list[str] = []
    emitted = ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        if text.endswith("\ufffd") and i + 1 < len(ids):
            continue
        if text.startswith(emitted) and len(text) > len(emitted):
            pieces.append(text[len(emitted) :])
            emitted = text
    return pieces


#: Call options the engine reads (``bind`` / ``bind_tools`` / ``invoke`` keyword arguments).
_REQUEST_KWARGS = frozenset(
    (
        "tools",
        "tool_choice",
        "response_format",
        "strict",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
    )
)
_warned_ignored: set[str] = set()


def _warn_ignored(names: set[str]) -> None:
    """Warn once per process for each call option the embedded engine does not read."""
    new = sorted(names - _warned_ignored)
    if new:
        _warned_ignored.update(new)
        warnings.warn(
            f"ChatAgentSpecVLLM ignores {', '.join(new)} (it reads "
            f"{', '.join(sorted(_REQUEST_KWARGS))}; set the rest on the engine)",
            UserWarning,
            stacklevel=4,
        )


_BASE_FIELDS = frozenset(BaseChatModel.model_fields)

_FOREIGN_FIELDS = {
    "model_name": "model",
    "max_completion_tokens": "max_tokens",
    "max_new_tokens": "max_tokens",
    "num_speculative_tokens": "k",
    "speculative_method": "speculative",
    "stop_sequences": "stop",
}
"""Other chat models' names for ChatAgentSpecVLLM's settings (ChatOpenAI, vLLM, HF)."""


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _option(name: str, value: Any, default: Any, kind: type[int] | type[float]) -> Any:
    """A call's numeric option as ``kind`` (``None``: the model's ``default``, as LangChain
    leaves unset options ``None``), or a ``ValueError`` that names it."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name}={value!r:.60} must be a number")
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name}={value!r:.60} must be a number") from None


@functools.lru_cache(maxsize=4)
def _standalone_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


_TAG = HERMES_TOOL_BLOCK[0]  # where streamed text turns into a tool call


class _DeltaChunker:
    """Engine text deltas -> message chunks.

    Content is passed on as it arrives until a ``<tool_call>`` block starts (a tail that
    could be the start of one, and trailing whitespace with a line break, which the parse
    strips when a block ends the output, are held back until more text comes); at the
    end, one chunk carries the tool calls and the content after the last streamed piece,
    so the chunks join to the ``invoke`` message's content -- except for whitespace the
    parse strips from an output with tool calls that had been streamed: leading
    whitespace, or spaces without a line break right before a final block.
    """

    def __init__(
        self, model: ChatAgentSpecVLLM, request: GenerationRequest, response_format: Any = None
    ) -> None:
        self.model = model
        self.request = request
        self.response_format = response_format
        self.text = ""
        self.emitted = 0
        self.in_block = False
        self.finished = False

    def feed(self, kind: str, value: Any) -> Iterable[ChatGenerationChunk]:
        if self.finished:  # one chunk per stream is the last: nothing follows it
            return []
        if kind == "final":
            self.finished = True
            return [self._finish(value)]
        self.text += str(value)
        if self.in_block:
            return []
        cut = self.text.find(_TAG)
        if cut >= 0:
            self.in_block = True
            safe = cut
        else:
            safe = len(self.text)
            for n in range(min(len(_TAG) - 1, len(self.text)), 0, -1):
                if self.text.endswith(_TAG[:n]):
                    safe -= n
                    break
        end = safe
        while end > self.emitted and self.text[end - 1].isspace():
            end -= 1
        if "\n" in self.text[end:safe]:  # a line break, as before a block: held back, the
            safe = end  # parse strips it when no text follows the block
        if safe <= self.emitted:
            return []
        piece, self.emitted = self.text[self.emitted : safe], safe
        return [ChatGenerationChunk(message=AIMessageChunk(content=piece))]

    def _finish(self, result: GenerationResult) -> ChatGenerationChunk:
        """The stream's last chunk, marked ``chunk_position="last"`` (else LangChain appends
        an empty one after it, and the stats would not be in the last chunk)."""
        message = self.model._message(result, self.request, self.response_format)
        meta = dict(message.response_metadata)
        calls = message.tool_calls or message.invalid_tool_calls
        rest = result.text[self.emitted :]
        if calls:  # the content is the text outside the blocks, stripped
            content = str(message.content)
            sent = result.text[: self.emitted]
            # whitespace at an edge the parse stripped, streamed already: cannot be undone
            if not content.startswith(sent):
                sent = sent.lstrip()
            if not content.startswith(sent):
                sent = sent.rstrip()
            rest = content[len(sent) :] if content.startswith(sent) else ""
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=rest,
                additional_kwargs=message.additional_kwargs,
                tool_call_chunks=_call_chunks(message),
                response_metadata=meta,
                usage_metadata=message.usage_metadata,
                chunk_position="last",
            )
        )
