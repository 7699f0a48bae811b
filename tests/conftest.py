"""Shared fixtures: the sample trace, a tiny byte-level BPE tokenizer built offline, and one
real ``agentspec serve`` for the modules that test the server at the engine's defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLE = FIXTURES / "agent_sample.jsonl"

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "(message['content'] if message['content'] is string else '') + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    texts = []
    for line in SAMPLE.read_text().splitlines():
        rec = json.loads(line)
        texts.append(rec["output"])
        prompt = rec["prompt"]
        texts += [prompt] if isinstance(prompt, str) else [str(m.get("content")) for m in prompt]
    return texts


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained on the sample (a real HF tokenizer, no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    fast.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture()
def sample_path() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def agentspec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``agentspec serve`` with the agentspec drafter at the engine tests' settings
    (:data:`tests.vllm.conftest.ENGINE_KW`; agent labels on, no scope binding), shared by
    ``tests/vllm/test_server.py`` and ``tests/security/test_server_open.py``: a start is
    ~25 s on 2 cores, and an idle server costs ~1 % of a core. Its base URL."""
    pytest.importorskip("vllm")
    from tests.serving import running_server
    from tests.vllm.conftest import ENGINE_KW

    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ["--speculative", "agentspec", "--k", str(ENGINE_KW["k"])]
    args += ["--max-model-len", str(ENGINE_KW["max_model_len"]), "--"]
    args += ["--enforce-eager", "--kv-cache-memory-bytes", str(ENGINE_KW["kv_cache_memory_bytes"])]
    args += ["--max-num-seqs", str(ENGINE_KW["max_num_seqs"])]
    with running_server(args, log) as base:
        yield base
