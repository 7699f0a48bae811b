"""Review 71 of the server integration: vLLM's beam search on servers that bind tenants'
scopes, and vLLM's ``--config`` YAML against the ``--api-key`` guard."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentspec_mw.cli import build_parser
from agentspec_mw_vllm.cli import serve_config_from_args
from agentspec_mw_vllm.tenancy import TenancyConfig
from tests.security.test_serve_review70 import _client, _post


def _cfg(*argv: str):  # type: ignore[no-untyped-def]
    return serve_config_from_args(build_parser().parse_args(["serve", "--model", "m", *argv]))


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"k1": "tenant-1"}))
    return path


# 1. beam search drops vllm_xargs


class _Tokenizer:
    eos_token_id = 0

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(map(str, tokens))


class _Renderer:
    def get_tokenizer(self) -> _Tokenizer:
        return _Tokenizer()


class _InputProcessor:
    def resolve_watermarking(self, params: Any) -> None:
        pass


class _EngineClient:
    """Records the sampling parameters of each request vLLM's beam search sends."""

    input_processor = _InputProcessor()

    def __init__(self) -> None:
        self.params: list[Any] = []

    async def generate(self, prompt: Any, params: Any, request_id: str, **kw: Any) -> Any:
        from vllm import CompletionOutput, RequestOutput
        from vllm.logprobs import Logprob

        self.params.append(params)
        out = CompletionOutput(
            index=0,
            text="",
            token_ids=[5],
            cumulative_logprob=-0.1,
            logprobs=[{5: Logprob(logprob=-0.1)}],
            finish_reason="length",
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=list(prompt["prompt_token_ids"]),
            prompt_logprobs=None,
            outputs=[out],
            finished=True,
        )


def test_vllm_beam_search_cannot_carry_vllm_xargs() -> None:
    """The premise, in vLLM's own code: a request's vllm_xargs reach the engine in its
    SamplingParams.extra_args, but BeamSearchParams has no extra_args, and beam search
    sends the engine fresh SamplingParams of its own (so the tags, the bound scope too,
    never arrive: the engine reads the request as tag-free, scope "default")."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.inputs import tokens_input

    xargs = {"agentspec_v": 1, "agentspec_scope": "tenant-1"}
    completion = CompletionRequest(model="m", prompt="p", use_beam_search=True, vllm_xargs=xargs)
    chat = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "p"}],
        use_beam_search=True,
        vllm_xargs=xargs,
    )
    assert completion.to_sampling_params(4, {}).extra_args == xargs  # the usual path
    for request in (completion, chat):
        params = request.to_beam_search_params(4, {})
        assert "extra_args" not in type(params).__struct_fields__

    class Serving(BeamSearchOnlineMixin):
        pass

    serving = Serving()
    engine = _EngineClient()
    serving.engine_client = engine  # type: ignore[assignment]
    serving.renderer = _Renderer()  # type: ignore[assignment]

    async def run() -> list[Any]:
        params = completion.to_beam_search_params(2, {})
        prompt = tokens_input([1, 2, 3])
        return [out async for out in serving.beam_search(prompt, "r", params)]

    outputs = asyncio.run(run())
    assert outputs and outputs[-1].finished
    assert len(engine.params) == 2  # one engine request per beam step
    assert all(p.extra_args is None for p in engine.params)


_BEAM = [True, "true", "yes", 1, "on"]


@pytest.mark.parametrize("value", _BEAM)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "m", "prompt": "p"}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "p"}]}),
        ("/invocations", {"model": "m", "prompt": "p"}),  # dispatches to the two above
    ],
)
def test_beam_search_is_refused_on_bound_servers(
    path: str, body: dict[str, Any], value: Any
) -> None:
    body = {**body, "use_beam_search": value}
    client, echo = _client(TenancyConfig(scope_keys={"k1": "tenant-1"}))
    r = _post(client, body, path, Authorization="Bearer k1")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "use_beam_search" and "beam search" in error["message"]
    assert echo.bodies == []
    client, echo = _client(TenancyConfig(scope_header="X-Tenant-Id"))
    assert _post(client, body, path, **{"X-Tenant-Id": "t1"}).status_code == 400
    assert echo.bodies == []
    client, echo = _client(TenancyConfig())  # unbound: one trust domain, passed on
    assert _post(client, body, path).status_code == 200 and echo.bodies == [body]


@pytest.mark.parametrize("value", [False, "false", "no", 0, "off"])
def test_requests_without_beam_search_are_bound_as_before(value: Any) -> None:
    body = {"model": "m", "prompt": "p", "use_beam_search": value}
    client, echo = _client(TenancyConfig(scope_keys={"k1": "tenant-1"}))
    assert _post(client, body, Authorization="Bearer k1").status_code == 200
    assert echo.bodies[0]["vllm_xargs"]["agentspec_scope"] == "tenant-1"
    assert echo.bodies[0]["use_beam_search"] == value


def test_a_use_beam_search_vllm_would_refuse_is_refused() -> None:
    """A value vLLM cannot read as a bool is no request it would serve: refused as one
    that may ask for beam search (fail closed), not passed on."""
    client, echo = _client(TenancyConfig(scope_keys={"k1": "tenant-1"}))
    body = {"model": "m", "prompt": "p", "use_beam_search": "maybe"}
    assert _post(client, body, Authorization="Bearer k1").status_code == 400
    assert echo.bodies == []


# 2. vLLM's --config YAML


@pytest.mark.parametrize(
    "key",
    ["api-key", "api_key", "api-k", "api_ke", "api-key.x"],
)
@pytest.mark.parametrize("value", ["secret", "[a, b]", "", "true"])
@pytest.mark.parametrize("form", ["split", "joined"])
def test_api_key_in_vllms_config_file_is_refused_when_bound(
    keys_file: Path, tmp_path: Path, key: str, value: str, form: str
) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text(f"max-num-seqs: 4\n{key}: {value}\n")
    given = ["--config", str(config)] if form == "split" else [f"--config={config}"]
    with pytest.raises(ValueError, match="--api-key") as info:
        _cfg("--scope-keys", str(keys_file), "--", *given)
    assert str(config) in str(info.value)
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-header", "X-Tenant-Id", "--", *given)
    assert _cfg("--", *given).extra_args == given  # unbound: vLLM's own key is fine


def test_a_config_file_without_an_api_key_passes_when_bound(
    keys_file: Path, tmp_path: Path
) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("api-server-count: 1\nmax-num-seqs: 4\n")
    cfg = _cfg("--scope-keys", str(keys_file), "--", "--config", str(config))
    assert cfg.extra_args == ["--config", str(config)]


@pytest.mark.parametrize(
    ("text", "match"),
    [(None, "cannot read"), ("a: [", "not YAML"), ("- api-key\n", "mapping")],
)
def test_a_config_file_the_guard_cannot_read_is_refused_when_bound(
    keys_file: Path, tmp_path: Path, text: str | None, match: str
) -> None:
    config = tmp_path / "vllm.yaml"
    if text is not None:
        config.write_text(text)
    with pytest.raises(ValueError, match=match):
        _cfg("--scope-keys", str(keys_file), "--", "--config", str(config))
    _cfg("--", "--config", str(config))  # unbound: not read here (vLLM reads it)


def test_dotted_api_key_option_is_refused_when_bound(keys_file: Path) -> None:
    """vLLM's parser regroups ``--api-key.x v`` into ``--api-key '{"x": "v"}'``."""
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-keys", str(keys_file), "--", "--api-key.x", "v")
    with pytest.raises(ValueError, match="--api-key"):
        _cfg("--scope-keys", str(keys_file), "--", "--api_k.x=v")
