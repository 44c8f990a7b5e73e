"""The real model (SmolLM2-135M-Instruct on vLLM's CPU build): a token trace replayed, a tool
call parsed by vLLM's parser and answered by a calculator over HTTP, and two GRPO iterations
whose weights reach the workers through POST /v1/weights."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from heddle.rollout import load_bench_workload, load_cluster, trace_path
from heddle.scheduler import get_policy
from heddle.scheduler.sim import Simulator

from .._rollout_fixtures import read_records

pytestmark = pytest.mark.slow  # real engines; `-m 'not slow'` skips them

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "examples" / "tool-calls"
sys.path.insert(0, str(TOOLS))
import calculator  # noqa: E402
import rate  # noqa: E402

sys.path.remove(str(TOOLS))


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from heddle.worker import named_model_dir

    return named_model_dir("smollm2")


@pytest.fixture
def calc() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """calculator.py on a free loopback port; the bodies it was sent."""
    seen: list[dict[str, Any]] = []
    server = calculator.serve("127.0.0.1", 0)
    original = server.RequestHandlerClass.do_POST

    def recording(handler: Any) -> None:
        length = int(handler.headers.get("Content-Length", "0"))
        raw = handler.rfile.read(length)
        seen.append(json.loads(raw))
        handler.rfile = __import__("io").BytesIO(raw)
        handler.headers.replace_header("Content-Length", str(len(raw)))
        original(handler)

    server.RequestHandlerClass = type("Recording", (calculator.Handler,), {"do_POST": recording})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    finally:
        server.shutdown()
        server.server_close()


def _run(job: Path, *args: str, timeout: float = 900) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "heddle", "run", str(job), "--quiet", *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=job.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _write_job(tmp: Path, spec: dict[str, Any]) -> Path:
    shape = [{"tp": 1, "replicas": 2}]
    pool = {"apiVersion": "heddle.dev/v1alpha1", "kind": "EnginePool", "metadata": {"name": "p"},
            "spec": {"model": "smollm2", "gpus": 2, "gpusPerNode": 2, "shape": shape,
                     "vllm": {"maxModelLen": 2048}}}  # fmt: skip
    output = {"path": "out/rollout.jsonl"}
    job = {"apiVersion": "heddle.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": "j"},
           "spec": {"enginePool": "p", "output": output, **spec}}  # fmt: skip
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump_all([pool, job]))
    return path


def test_a_real_models_trace_replays_with_its_own_steps(smollm2: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    questions = ["What is the capital of France?", "Name three colours.", "What is 12 plus 30?"]
    tasks = [{"id": f"q{i}", "prompt": p} for i, p in enumerate(questions)]
    job = _write_job(tmp_path, {
        "tasks": {"inline": tasks}, "samplesPerTask": 3, "environment": {"type": "tools"},
        "sampling": {"temperature": 1.0, "seed": 3, "maxTokensPerTurn": 48, "maxTotalTokens": 48},
        "maxTurns": 1})  # fmt: skip
    stdout = _run(job, "--trace")
    output = tmp_path / "out" / "rollout.jsonl"
    assert f"trace: {trace_path(output)}" in stdout
    records = {(r["task_id"], r["sample"]): r for r in read_records(output)}
    lines = [json.loads(x) for x in trace_path(output).read_text().splitlines()]
    assert len(lines) == len(records) == 9
    tok = AutoTokenizer.from_pretrained(smollm2)
    for line in lines:
        record = records[(line["task_id"], line["sample"])]
        (step,) = line["steps"]
        assert step["input_token_ids"] == record["prompt_token_ids"]
        assert step["output_token_ids"] == record["response_token_ids"]
        # The ids are the real tokenizer's: the prompt holds the question, the output the text.
        question = next(t["prompt"] for t in tasks if t["id"] == line["task_id"])
        assert question in tok.decode(step["input_token_ids"])
        assert tok.decode(step["output_token_ids"]) == record["messages"][-1]["content"]
        assert step["finish_reason"] in ("stop", "length") and step["engine_s"] > 0
    bench = load_bench_workload(str(trace_path(output)), seed=0)
    sim = Simulator(bench.scripts, load_cluster("2xcpu-tiny"), get_policy("heddle"),
                    tool_means_s=bench.tool_means_s)  # fmt: skip
    result = sim.run()
    assert result.tokens == sum(len(r["response_token_ids"]) for r in records.values())
    for s in sim.sims.values():
        assert tuple(s.traj.turn_tokens) == tuple(len(x) for x in s.script.step_token_ids)


def test_a_real_models_tool_calls_go_through_the_parser_and_replies_come_back(
    smollm2: Path, tmp_path: Path, calc: tuple[str, list[dict[str, Any]]]
) -> None:
    from transformers import AutoTokenizer

    url, seen = calc
    spec = yaml.safe_load_all((TOOLS / "job.yaml").read_text())
    job_spec = next(d for d in spec if d["kind"] == "RolloutJob")["spec"]
    job_spec["environment"]["tools"]["endpoints"][0]["url"] = url
    questions = [json.loads(x) for x in (TOOLS / "tasks.jsonl").read_text().splitlines()[:8]]
    # One conversation where the call was already made and answered (a task holds text
    # messages: the call as SmolLM2 writes it): the model's next turn must come after the
    # calculator's reply, rendered in SmolLM2's format.
    made = '<tool_call>[{"name": "calculator", "arguments": {"expression": "17*23"}}]</tool_call>'
    answered = {"id": "answered", "messages": [
        {"role": "user", "content": "What is 17 times 23? Use the calculator."},
        {"role": "assistant", "content": made},
        {"role": "tool", "content": "391"}]}  # fmt: skip
    job_spec["tasks"] = {"inline": [*questions, answered]}
    job = _write_job(
        tmp_path, {k: v for k, v in job_spec.items() if k not in ("output", "enginePool")}
    )
    _run(job, "--trace")
    output = tmp_path / "out" / "rollout.jsonl"
    records = read_records(output)
    lines = trace_path(output).read_text().splitlines()
    traces = {line["task_id"]: line for line in map(json.loads, lines)}
    tok = AutoTokenizer.from_pretrained(smollm2)
    assert len(records) == 9 and all(r["status"] == "done" for r in records)
    # The schema reached the model through the chat template (SmolLM2's tool prompt).
    prompt = tok.decode(traces["calc-00"]["steps"][0]["input_token_ids"])
    listed = json.loads(prompt.split("<tools>", 1)[1].split("</tools>", 1)[0])
    assert [t["name"] for t in listed] == ["calculator"]
    # Every call vLLM's xlam parser found reached the calculator, and only those.
    r = rate.rates(records)
    assert len(seen) == sum(x["tool_calls"] - x["tool_errors"] for x in records)
    for record in records:
        steps = traces[record["task_id"]]["steps"]
        first = rate.first_turn(record)
        if first.get("tool_calls") and record["tool_calls"] > record["tool_errors"]:
            tool = next(m for m in record["messages"] if m["role"] == "tool")
            expression = json.loads(first["tool_calls"][0]["function"]["arguments"])["expression"]
            assert (
                tool["content"] == calculator.answer({"arguments": {"expression": expression}})[1]
            )
            assert f"<|im_start|>tool\n{tool['content']}<|im_end|>" in tok.decode(
                steps[1]["input_token_ids"]
            )
    # The answered conversation: the reply is in the context, and the model went on after it.
    context = tok.decode(traces["answered"]["steps"][0]["input_token_ids"])
    assert made in context
    assert context.endswith("<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n")
    assert traces["answered"]["steps"][0]["output_token_ids"]
    assert r["trajectories"] == 9


def test_two_grpo_iterations_push_trained_weights_to_the_workers(tmp_path: Path) -> None:
    example = ROOT / "examples" / "training-loop" / "grpo.py"
    args = ["--iterations", "2", "--prompts", "4", "--samples", "4", "--max-tokens", "24",
            "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = json.loads((tmp_path / "history.json").read_text())["iterations"]
    assert [h["weight_version"] for h in history] == ["0", "1"]
    for it in (0, 1):
        records = read_records(tmp_path / f"iter-{it}.jsonl")
        assert len(records) == 16 and {r["weight_version"] for r in records} == {str(it)}
    # The trained checkpoint differs from the start, and the workers served it (version 1).
    assert (tmp_path / "ckpt" / "iter-1" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "iter-2" / "model.safetensors").is_file()
    assert "iteration 1: reward" in done.stdout
