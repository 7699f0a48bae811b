"""The examples run: every notebook top to bottom (as ``pytest --nbmake examples/`` would),
the ``create_agent`` script on the embedded engine, and the remote-server and middleware
scripts against a fake OpenAI endpoint (the tags reach the request bodies as
``vllm_xargs``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .langgraph.fake_openai import FakeOpenAI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: pydantic resolves hints in it
    spec.loader.exec_module(module)
    return module


def test_all_four_notebooks_are_collected() -> None:
    assert {p.stem for p in NOTEBOOKS} >= {
        "map_reduce_research",
        "supervisor_tools",
        "reflexion_retry",
        "replay_your_traces",
    }


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path) -> None:
    """Executed in a fresh kernel (its own process: its own embedded engine)."""
    pytest.importorskip("vllm")
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name}: commit notebooks without outputs"
    )
    client = NotebookClient(
        notebook,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(EXAMPLES)}},
        # the kernel is killed once the last cell ran: a graceful shutdown waited ~3.4 s
        # for Python's teardown of vLLM and torch (the notebooks shut their engine down)
        shutdown_kernel="immediate",
    )
    client.execute()  # raises CellExecutionError on the first failing cell


def test_remote_server_script_tags_requests() -> None:
    import httpx

    server = FakeOpenAI()
    script = _load("remote_server")
    base = "http://vllm.test:8000/v1"
    app = script.build_app(
        base, "served-model", http_client=httpx.Client(transport=server.transport), max_retries=0
    )
    result = app.invoke({"messages": [("user", "What is 12 * 34?")]})
    assert result["messages"][-1].content
    bodies = server.bodies
    assert len(bodies) >= 2  # the tool call, then the answer
    agents = {b["vllm_xargs"]["agentspec_agent"] for b in bodies}
    assert agents == {"model"}


def test_agent_middleware_script_tags_requests() -> None:
    import httpx

    server = FakeOpenAI()
    script = _load("agent_middleware")
    agent, tagging = script.build_agent(
        "http://vllm.test:8000/v1",
        "served-model",
        scope="tenant-a",
        http_client=httpx.Client(transport=server.transport),
        max_retries=0,
    )
    result = agent.invoke({"messages": script.conversation("What is the weather in Paris?")})
    assert [m.type for m in result["messages"][4:]] == ["human", "ai", "tool", "ai"]
    bodies = server.bodies
    assert len(bodies) == 2  # the tool call, then the answer
    assert {
        (b["vllm_xargs"]["agentspec_agent"], b["vllm_xargs"]["agentspec_scope"]) for b in bodies
    } == {("model", "tenant-a")}
    assert (tagging.stats.model_calls, tagging.stats.tags_delivered) == (2, 2)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_create_agent_script_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vllm")
    script = _load("wrap_create_agent")
    assert script.main(["What is 2 + 3?", "--max-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "human: 'What is 2 + 3?'" in out
    assert "drafts model/" in out


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_structured_outputs_script_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Both tickets routed to a parsed schema, a forced call each, the extractors drafted."""
    pytest.importorskip("vllm")
    script = _load("structured_outputs")
    assert script.main(["--max-tokens", "48"]) == 0
    out = capsys.readouterr().out
    assert out.count("  route: Route(category=") == 2
    assert out.count("  tool call: open_case(") == 2
    assert "drafts extract/" in out
