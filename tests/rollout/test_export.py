"""Export: records in verl's, slime's, SkyRL's and OpenRLHF's sample shapes, checked field by field.

The schemas below are the trainers' own (docs/rollouts.md, "Export to a trainer",
names the source file and commit of each).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heddle.api import RewardSpec, SamplingSpec, ToolsSpec
from heddle.cli._export import _TRAINERS
from heddle.cli._main import main
from heddle.exceptions import OutputError
from heddle.export import TRAINERS, collate_skyrl, collate_verl, convert_records, read_rollouts
from heddle.rollout import (
    LocalPool,
    OutputSink,
    RolloutSession,
    ScriptedReward,
    SessionConfig,
    ToolsEnvironment,
    read_tasks,
)
from heddle.scheduler import HARDWARE_PRESETS, MODEL_PRESETS, PerfModel
from heddle.worker import WorkerEndpoint

INTS = "list[int]"
FLOATS = "list[float]"
# field -> type, per trainer; "?" marks a field that may be null.
SCHEMAS: dict[str, dict[str, Any]] = {
    "verl": {
        "batch": {
            "prompts": INTS,
            "responses": INTS,
            "response_mask": INTS,
            "input_ids": INTS,
            "attention_mask": INTS,
            "position_ids": INTS,
        },
        "non_tensor_batch": {
            "data_source": str,
            "reward_model": dict,
            "extra_info": dict,
            "uid": str,
            "index": int,
            "raw_prompt": list,
            "__num_turns__": int,
        },
    },
    "slime": {  # slime/utils/types.py Sample
        "group_index": int,
        "index": int,
        "prompt": list,
        "tokens": INTS,
        "response": str,
        "response_length": int,
        "label": "str?",
        "reward": "float?",
        "loss_mask": INTS,
        "weight_versions": list,
        "rollout_log_probs": "list[float]?",
        "status": str,
        "metadata": dict,
    },
    "skyrl": {  # skyrl_train/generators/base.py GeneratorOutput, one entry of each list
        "prompt_token_ids": INTS,
        "response_ids": INTS,
        "rewards": "float?",
        "loss_masks": INTS,
        "stop_reasons": str,
        "rollout_logprobs": "list[float]?",
        "trajectory_ids": dict,
    },
    "openrlhf": {  # openrlhf/trainer/ppo_utils/samples_generator.py, an executor's result
        "prompt": str,
        "label": "str?",
        "observation_tokens": INTS,
        "action_ranges": list,
        "rollout_log_probs": "list[float]?",
        "truncated": bool,
        "reward": "float?",
        "scores": "float?",
        "extra_logs": dict,
        "index": int,
        "info": dict,
    },
    "areal": {  # docs/en/reference/rollout_workflow.md, one row of the tensor dict
        "input_ids": INTS,
        "attention_mask": INTS,
        "loss_mask": INTS,
        "logprobs": FLOATS,
        "versions": INTS,
        "rewards": float,
        "info": dict,
    },
    "roll": {  # traj_env_manager.py formulate_rollouts, unpadded
        "batch": {
            "input_ids": INTS,
            "attention_mask": INTS,
            "position_ids": INTS,
            "response_mask": INTS,
            "prompt_mask": INTS,
            "scores": FLOATS,
            "infer_logprobs": FLOATS,
        },
        "non_tensor_batch": {
            "env_ids": int,
            "group_ids": int,
            "tags": str,
            "step_scores": list,
            "episode_scores": float,
            "traj_group_id": str,
            "traj_id": str,
        },
    },
}
# (token list, mask) pairs that must align one to one, and (whole, prompt, response) splits.
ALIGNED = {
    "verl": [
        ("batch.responses", "batch.response_mask"),
        ("batch.input_ids", "batch.attention_mask"),
    ],
    "slime": [("tokens", None)],
    "skyrl": [("response_ids", "loss_masks")],
    "openrlhf": [("observation_tokens", "rollout_log_probs")],
    "areal": [("input_ids", "loss_mask"), ("input_ids", "logprobs"), ("input_ids", "versions")],
    "roll": [("batch.input_ids", "batch.response_mask"), ("batch.input_ids", "batch.scores")],
}


def _is(value: Any, kind: Any) -> bool:
    if isinstance(kind, str) and kind.endswith("?"):
        return value is None or _is(value, kind[:-1])
    if kind == INTS:
        return isinstance(value, list) and all(type(v) is int for v in value)
    if kind in (FLOATS, "list[float]"):
        return isinstance(value, list) and all(isinstance(v, float) for v in value)
    if kind in ("float", float):
        return isinstance(value, float)
    if kind in ("str", str):
        return isinstance(value, str)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def assert_schema(trainer: str, row: dict[str, Any]) -> None:
    schema = SCHEMAS[trainer]
    nested = trainer in ("verl", "roll")
    parts = schema.items() if not nested else []
    if nested:
        for part, fields in schema.items():
            for name, kind in fields.items():
                assert name in row[part], f"{trainer} {part}.{name} missing"
                assert _is(row[part][name], kind), f"{trainer} {part}.{name}: {row[part][name]!r}"
    for name, kind in parts:
        assert name in row, f"{trainer} {name} missing"
        assert _is(row[name], kind), f"{trainer} {name}: {row[name]!r}"


def _get(row: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        row = row[part]
    return row


def _record(task_index: int, sample: int, status: str = "done", **extra: Any) -> dict[str, Any]:
    prompt = [100 + task_index, 101]
    response = [7, 8, 9, 10, 11]
    rec = {
        "task_id": f"t{task_index}",
        "sample": sample,
        "trajectory_id": f"t{task_index}-{sample}",
        "status": status,
        "finish_reason": {"done": "stop", "truncated": "length"}.get(status, "failed"),
        "error": None,
        "messages": [
            {"role": "user", "content": f"question {task_index}"},
            {"role": "assistant", "content": "call"},
            {"role": "tool", "content": "42"},
            {"role": "assistant", "content": "answer 42"},
        ],
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_mask": [1, 1, 0, 0, 1],
        "response_logprobs": [-0.5, -0.25, 0.0, 0.0, -1.0],
        "turns": 2,
        "metadata": {"m": task_index},
        "task_index": task_index,
        "task_fields": {
            "data_source": "gsm8k",
            "reward_model": {"style": "rule", "ground_truth": str(task_index)},
            "extra_info": {"index": task_index},
        },
        "reward": 1.0 if sample % 2 == 0 else 0.0,
        "reward_info": None,
        "reward_error": None,
    }
    rec.update(extra)
    return rec


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def output(tmp_path: Path) -> Path:
    # Finish order, not batch order: task 10 sorts after task 2 (by index, not by id text).
    records = [_record(i, s) for i, s in [(10, 1), (2, 1), (0, 0), (10, 0), (2, 0), (0, 1)]]
    records.append(_record(2, 2, status="failed", reward=None))
    records.append(_record(0, 2, status="truncated"))
    return _write(tmp_path / "out.jsonl", records)


EXPECTED_ORDER = [(0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (10, 0), (10, 1)]


def test_cli_and_reader_offer_the_same_trainers() -> None:
    assert sorted(_TRAINERS) == sorted(TRAINERS)


@pytest.mark.parametrize("trainer", sorted(SCHEMAS))
def test_each_row_has_every_field_typed_in_batch_order_with_aligned_masks(
    output: Path, trainer: str
) -> None:
    rows = read_rollouts(output, trainer, failed="drop")
    assert len(rows) == len(EXPECTED_ORDER)  # the failed one is left out
    for row, (task, sample) in zip(rows, EXPECTED_ORDER, strict=True):
        assert_schema(trainer, row)
        rec = _record(task, sample)
        tokens = rec["prompt_token_ids"] + rec["response_token_ids"]
        for ids, mask in ALIGNED[trainer]:
            if mask is not None:
                assert len(_get(row, ids)) == len(_get(row, mask))
        if trainer == "verl":
            assert row["batch"]["input_ids"] == tokens
            assert row["batch"]["response_mask"] == rec["response_mask"]
            assert row["non_tensor_batch"]["uid"] == f"t{task}"
            assert row["batch"]["rm_scores"][-1] == rec["reward"]
            assert row["batch"]["rollout_log_probs"] == rec["response_logprobs"]
        elif trainer == "slime":
            assert row["tokens"] == tokens and row["group_index"] == task
            assert row["loss_mask"] == rec["response_mask"]
            assert row["response_length"] == len(row["loss_mask"]) == len(rec["response_token_ids"])
            assert row["label"] == str(task) and row["response"] == "call\n42\nanswer 42"
            assert row["status"] == ("truncated" if (task, sample) == (0, 2) else "completed")
        elif trainer == "skyrl":
            assert row["trajectory_ids"] == {"instance_id": f"t{task}", "repetition_id": sample}
            assert row["prompt_token_ids"] + row["response_ids"] == tokens
            assert row["stop_reasons"] == ("length" if (task, sample) == (0, 2) else "stop")
        elif trainer == "openrlhf":
            assert row["observation_tokens"] == tokens
            assert row["action_ranges"] == [(2, 4), (6, 7)]  # mask 1,1,0,0,1 after 2 prompt ids
            assert row["rollout_log_probs"] == [0.0, 0.0, *rec["response_logprobs"]]
            assert row["truncated"] is ((task, sample) == (0, 2))
        elif trainer == "areal":
            assert row["input_ids"] == tokens and row["loss_mask"] == [0, 0, 1, 1, 0, 0, 1]
            assert row["rewards"] == rec["reward"]
        else:
            assert row["batch"]["input_ids"] == tokens
            assert row["batch"]["response_mask"] == [0, 0, 1, 1, 0, 0, 1]
            assert row["batch"]["scores"][-1] == rec["reward"]
            assert row["non_tensor_batch"]["traj_group_id"] == f"t{task}"


def test_keep_failed_keeps_them_in_place(output: Path) -> None:
    rows = read_rollouts(output, "skyrl", failed="keep")
    ids = [(r["trajectory_ids"]["instance_id"], r["trajectory_ids"]["repetition_id"]) for r in rows]
    assert ids[3:6] == [("t2", 0), ("t2", 1), ("t2", 2)]
    assert rows[5]["rewards"] is None and rows[5]["stop_reasons"] == "failed"


def test_collate_verl_pads_like_a_dataproto(tmp_path: Path) -> None:
    short = _record(1, 0, prompt_token_ids=[5], response_token_ids=[6], response_mask=[1])
    del short["response_logprobs"]
    path = _write(tmp_path / "o.jsonl", [_record(0, 0), short])
    tensors, non_tensors = collate_verl(read_rollouts(path, "verl"), pad_token_id=-1)
    assert tensors["prompts"].tolist() == [[100, 101], [-1, 5]]  # left-padded
    assert tensors["responses"].tolist() == [[7, 8, 9, 10, 11], [6, -1, -1, -1, -1]]
    assert tensors["response_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert tensors["attention_mask"].tolist() == [[1] * 7, [0, 1, 1, 0, 0, 0, 0]]
    assert tensors["position_ids"].tolist() == [list(range(7)), [0, 0, 1, 1, 1, 1, 1]]
    assert tensors["input_ids"].shape == (2, 7)
    assert tensors["rm_scores"][:, :].tolist() == [[0, 0, 0, 0, 1.0], [1.0, 0, 0, 0, 0]]
    assert "rollout_log_probs" not in tensors  # only when every row has them
    assert non_tensors["uid"].dtype == object and non_tensors["uid"].tolist() == ["t0", "t1"]
    assert non_tensors["reward_model"][1] == {"style": "rule", "ground_truth": "1"}
    assert all(len(v) == 2 for v in non_tensors.values())


def test_collate_skyrl_is_a_generator_output(output: Path) -> None:
    out = collate_skyrl(read_rollouts(output, "skyrl"))
    assert set(out) == {
        "prompt_token_ids",
        "response_ids",
        "rewards",
        "loss_masks",
        "stop_reasons",
        "rollout_metrics",
        "rollout_logprobs",
        "trajectory_ids",
        "is_last_step",
        "sampling_masks",
    }
    # Whole groups: task 2's failed sample 2 and task 10's missing sample 2 are placeholders
    # (mask zero; the reward their group's mean, so the GRPO baseline does not move).
    assert len(out["response_ids"]) == len(out["loss_masks"]) == len(EXPECTED_ORDER) + 2
    assert out["rewards"] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5]
    assert out["loss_masks"][5] == [0] * 5 and out["loss_masks"][8] == []
    assert out["stop_reasons"][5] == out["stop_reasons"][8] == "failed"
    assert np.array(out["rollout_logprobs"][:8]).shape == (8, 5)


@pytest.mark.parametrize(
    ("edit", "sentence"),
    [
        (
            {"response_mask": [1, 1]},
            "line 2: response_mask has 2 entries but response_token_ids has 5",
        ),
        ({"response_logprobs": [0.0]}, "line 2: response_logprobs has 1 entries"),
        ({"prompt_token_ids": "abc"}, "line 2: prompt_token_ids must be a list of integers"),
        ({"reward": "high"}, "line 2: reward must be a number or null"),
        ({"sample": "0"}, "line 2: sample must be an integer"),
        ({"task_id": None}, "line 2 is not a Heddle record (no task_id)"),
        ({"messages": ["hi"]}, "line 2: messages must be a list of objects"),
        ({"task_fields": [1]}, "line 2: task_fields must be an object"),
    ],
)
def test_bad_record_is_named_by_line_and_field(
    tmp_path: Path, edit: dict[str, Any], sentence: str
) -> None:
    path = _write(tmp_path / "o.jsonl", [_record(0, 0), {**_record(0, 1), **edit}])
    with pytest.raises(OutputError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
        read_rollouts(path, "slime")


def test_odd_trainer_fields_do_not_break_the_export(tmp_path: Path) -> None:
    odd = _record(0, 0, task_fields={"reward_model": "rule", "extra_info": None, "label": 7})
    rows = read_rollouts(_write(tmp_path / "o.jsonl", [odd]), "verl")
    assert rows[0]["non_tensor_batch"]["index"] == 0  # no extra_info.index: the task index
    assert read_rollouts(tmp_path / "o.jsonl", "slime")[0]["label"] == "7"  # JSON text


def test_records_without_task_index_keep_first_seen_task_order(tmp_path: Path) -> None:
    old = [{**_record(i, s), "task_id": f"x{i}"} for i, s in [(5, 1), (3, 0), (5, 0), (3, 1)]]
    for rec in old:
        del rec["task_index"]
    rows = read_rollouts(_write(tmp_path / "o.jsonl", old), "skyrl")
    ids = [(r["trajectory_ids"]["instance_id"], r["trajectory_ids"]["repetition_id"]) for r in rows]
    assert ids == [("x5", 0), ("x5", 1), ("x3", 0), ("x3", 1)]


def test_repeated_trajectory_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "o.jsonl", [_record(0, 0), _record(1, 0), _record(0, 0)])
    with pytest.raises(OutputError, match="line 3 repeats task 't0' sample 0 of line 1"):
        read_rollouts(path, "verl")


def test_cli_export_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["export", "--to", "slime", str(bad), str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1 is not JSON" in err
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["export", "--to", "slime", str(bad), str(bad)]) == 2
    assert "is the input" in capsys.readouterr().err


def test_the_python_examples_in_the_docs_run(
    output: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "rollouts.md").read_text()
    blocks = [b.split("```", 1)[0] for b in docs.split("```python\n")[1:]]
    (tmp_path / "rollout.jsonl").write_text(output.read_text())
    monkeypatch.chdir(tmp_path)
    assert len(blocks) >= 2  # the reward endpoint and the export reader
    for block in blocks:
        exec(compile(block, "docs/rollouts.md", "exec"), {"__name__": "docs"})


# -- end to end: trainer rows in, a rollout with rewards, trainer rows out -----------------


@pytest.mark.slow  # its fixture starts sim worker processes
def test_verl_rows_roll_out_and_export_to_every_trainer(
    scripted_pool: tuple[LocalPool, list[WorkerEndpoint]], tmp_path: Path
) -> None:
    _, workers = scripted_pool
    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": f"<reply>the answer is {i}</reply>"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"split": "train", "index": 100 + i},
        }
        for i in range(3)
    ]
    tasks_path = tmp_path / "train.jsonl"
    tasks_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = read_tasks(path=tasks_path).tasks
    env = ToolsEnvironment(ToolsSpec())
    env.reward = ScriptedReward(RewardSpec("scripted", success_rate=0.5))
    out = tmp_path / "out.jsonl"
    session = RolloutSession(
        job="t",
        tasks=tasks,
        samples_per_task=2,
        environment=env,
        workers=workers,
        sink=OutputSink(out),
        perf=PerfModel(MODEL_PRESETS["qwen3-8b"], HARDWARE_PRESETS["h100-sxm"]),
        sampling=SamplingSpec(max_tokens_per_turn=64, max_total_tokens=64, logprobs=True),
        max_turns=2,
        config=SessionConfig(replan_interval_s=0.3, health_interval_s=0.2),
    )
    asyncio.run(session.run())
    for trainer in sorted(SCHEMAS):
        target = tmp_path / f"{trainer}.jsonl"
        assert main(["export", "--to", trainer, str(out), str(target)]) == 0
        exported = [json.loads(line) for line in target.read_text().splitlines()]
        assert len(exported) == 6
        for row in exported:
            assert_schema(trainer, row)
    verl = [json.loads(line) for line in (tmp_path / "verl.jsonl").read_text().splitlines()]
    assert [r["non_tensor_batch"]["index"] for r in verl] == [100, 100, 101, 101, 102, 102]
    assert verl[0]["non_tensor_batch"]["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert all(r["non_tensor_batch"]["ability"] == "math" for r in verl)
    tensors, _ = collate_verl(verl)
    assert tensors["input_ids"].shape[0] == 6
    assert (
        tensors["response_mask"] <= tensors["attention_mask"][:, -tensors["responses"].shape[1] :]
    ).all()


@pytest.mark.slow  # heddle run as a subprocess with worker processes
def test_heddle_run_with_trainer_rows_and_a_reward_then_export(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    rows = [
        {
            "data_source": "gsm8k",
            "prompt": [{"role": "user", "content": f"<reply>the answer is {i}</reply>"}],
            "env_class": "gsm8k",
            "reward_spec": {"method": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(3)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "EnginePool",
        "metadata": {"name": "local"},
        "spec": {"model": "tiny", "gpus": 1, "gpusPerNode": 1, "shape": [{"tp": 1}]},
    }
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "job"},
        "spec": {
            "enginePool": "local",
            "tasks": {"path": "train.jsonl"},
            "samplesPerTask": 2,
            "environment": {"reward": {"type": "scripted", "successRate": 0.5, "seed": 1}},
            "output": {"path": "out/rollout.jsonl"},
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump_all([pool, job]))

    def heddle(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "heddle", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    run = heddle("run", "job.yaml", "--engine", "sim", "--scripted-replies", "--quiet")
    assert run.returncode == 0, run.stdout + run.stderr
    records = [json.loads(x) for x in (tmp_path / "out" / "rollout.jsonl").read_text().splitlines()]
    assert len(records) == 6
    assert all(
        r["reward"] in (0.0, 1.0) and r["reward_info"] == {"scripted": True} for r in records
    )
    assert {r["task_fields"]["env_class"] for r in records} == {"gsm8k"}
    export = heddle("export", "--to", "skyrl", "out/rollout.jsonl", "skyrl.jsonl")
    assert export.returncode == 0, export.stderr
    assert "wrote 6 skyrl rows" in export.stderr
    exported = [json.loads(x) for x in (tmp_path / "skyrl.jsonl").read_text().splitlines()]
    assert [r["trajectory_ids"]["instance_id"] for r in exported] == ["0", "0", "1", "1", "2", "2"]
    by_key = {(r["task_id"], r["sample"]): r["reward"] for r in records}
    assert [r["rewards"] for r in exported] == [
        by_key[(r["trajectory_ids"]["instance_id"], r["trajectory_ids"]["repetition_id"])]
        for r in exported
    ]


def test_areal_versions_follow_the_step_that_generated_each_token() -> None:
    # Two steps under versions 3 and 4 (a weight push between them); the tool reply
    # in between is not the policy's and gets -1, as do the prompt tokens.
    segments = [
        {"weight_version": "3", "response_start": 0, "response_end": 2},
        {"weight_version": "4", "response_start": 4, "response_end": 5},
    ]
    rec = _record(0, 0, weight_version="3", segments=segments)
    row = convert_records([rec], "areal")[0]
    assert row["versions"] == [-1, -1, 3, 3, -1, -1, 4]
    assert row["info"]["task_id"] == "t0"
