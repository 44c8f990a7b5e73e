"""A trainer's batch through heddle.client on sim workers, with a trajectory that fails
inside a group: every adapter's runner returns one record per row, in order, whole."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from heddle.export import collate_skyrl, collate_verl, convert_records
from heddle.integrations import (
    HeddleRollouts,
    HeddleSettings,
    SampleBatcher,
    openrlhf_result,
    skyrl_output,
    skyrl_tasks,
    verl_output_fields,
)

pytestmark = pytest.mark.slow  # worker processes (sim engine)

POOL = Path(__file__).resolve().parents[2] / "examples" / "synthetic" / "pool.yaml"
FAILING = ("000001", 1)  # (task, sample) whose reward call is refused: the trajectory fails


@pytest.fixture(scope="module")
def reward_url() -> Iterator[str]:
    """Scores sample s as s / 4; refuses FAILING with a 400 (onError: fail fails it)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, reply = 200, {"reward": body["sample"] / 4}
            if (body["task_id"], body["sample"]) == FAILING:
                status, reply = 400, {"error": "refused"}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()


def _settings(tmp_path: Path, reward_url: str, **more: Any) -> HeddleSettings:
    job = {
        "apiVersion": "heddle.dev/v1alpha1",
        "kind": "RolloutJob",
        "metadata": {"name": "trainer"},
        "spec": {
            "enginePool": "tiny",
            "tasks": {"inline": [{"id": "placeholder", "prompt": "replaced per batch"}]},
            "environment": {
                "type": "tools",
                "tools": {"endpoints": []},
                "reward": {"type": "http", "url": reward_url, "onError": "fail", "retries": 0},
            },
            "sampling": {"maxTokensPerTurn": 12, "maxTotalTokens": 24},
            "maxTurns": 1,
            "output": {"path": "unused.jsonl"},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return HeddleSettings(
        job=str(path), pool=str(POOL), engine="sim", work_dir=str(tmp_path / "work"),
        time_scale=0.05, **more,
    )  # fmt: skip


PROMPTS = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]


def test_a_batch_comes_back_in_order_with_the_failed_sample_as_a_placeholder(
    tmp_path: Path, reward_url: str
) -> None:
    rollouts = HeddleRollouts(_settings(tmp_path, reward_url))
    tasks = [{"prompt": p, "data_source": "test", "extra_info": {"index": i}} for i, p in
             enumerate(PROMPTS)]  # fmt: skip
    records = asyncio.run(rollouts.run(tasks, 3))
    assert [(r["task_id"], r["sample"]) for r in records] == [
        (f"{t:06d}", s) for t in range(3) for s in range(3)
    ]
    failed = records[3 * 1 + 1]
    assert failed["placeholder"]["reason"] and set(failed["response_mask"]) <= {0}
    assert failed["reward"] is None and failed["status"] == "failed"
    assert failed["placeholder"]["reward_fill"] == pytest.approx((0 + 0.5) / 2)
    for r in records:
        assert r["task_fields"]["data_source"] == "test"
        if r is not failed:
            assert r["status"] in ("done", "truncated") and r["reward"] == r["sample"] / 4
            assert sum(r["response_mask"]) > 0
            # RL-ready by default: the rollout policy's logprobs, one per response token
            assert len(r["response_logprobs"]) == len(r["response_token_ids"])
    # The trainers' own batch shapes keep the order and the group (verl unions by uid).
    tensors, non_tensors = collate_verl(convert_records(records, "verl"))
    assert tensors["response_mask"][4].sum() == 0 and tensors["response_mask"][3].sum() > 0
    assert non_tensors["uid"].tolist() == [f"{t:06d}" for t in range(3) for _ in range(3)]
    assert non_tensors["heddle_placeholder"][4] and non_tensors["heddle_placeholder"][3] is None
    skyrl = collate_skyrl(convert_records(records, "skyrl"))
    assert len(skyrl["response_ids"]) == 9 and sum(skyrl["loss_masks"][4]) == 0
    fields = verl_output_fields(failed)
    assert fields["response_mask"] == [0] * len(fields["response_ids"])
    assert fields["extra_fields"]["heddle_placeholder"] == failed["placeholder"]["reason"]


def test_one_sample_calls_meet_in_one_job_grouped_and_each_gets_its_own(
    tmp_path: Path, reward_url: str
) -> None:
    """verl, OpenRLHF, AReaL and ROLL call once per sample: the batcher makes one job of
    the calls of a window, a group per key, and answers each call with its row."""
    settings = _settings(tmp_path, reward_url, batch_window_s=0.2)

    async def main() -> list[dict[str, Any]]:
        batcher = SampleBatcher(HeddleRollouts(settings))
        calls = [  # interleaved, as a trainer's gather starts them
            batcher.submit({"prompt": PROMPTS[i % 3]}, group=f"uid{i % 3}") for i in range(9)
        ]
        return list(await asyncio.gather(*calls))

    got = asyncio.run(main())
    assert len(list((tmp_path / "work").glob("batch-*.jsonl"))) == 1  # one RolloutJob
    for i, record in enumerate(got):
        assert record["task_id"] == f"{i % 3:06d}" and record["sample"] == i // 3
    assert "placeholder" in got[1 + 3 * 1]  # uid1's second call: task 1, sample 1
    result = openrlhf_result(got[0], "question 0", None)
    assert (
        result["observation_tokens"][: len(got[0]["prompt_token_ids"])]
        == (got[0]["prompt_token_ids"])
    )
    assert len(result["rollout_log_probs"]) == len(result["observation_tokens"])


def test_skyrl_generator_input_keeps_its_order_and_trajectory_ids(
    tmp_path: Path, reward_url: str
) -> None:
    """GeneratorInput repeats each instance per sample; the output is "in the same order"."""
    ids = [f"i{k % 2}" for k in range(4)]  # i0, i1, i0, i1
    prompts = [PROMPTS[k % 2] for k in range(4)]
    grouped = skyrl_tasks(prompts, [{"env_class": "x"}] * 4, ids)
    assert grouped is not None
    tasks, samples, slots = grouped
    assert samples == 2 and slots == [(0, 0), (1, 0), (0, 1), (1, 1)]
    rollouts = HeddleRollouts(_settings(tmp_path, reward_url))
    records = asyncio.run(rollouts.run(tasks, samples))
    by_key = {(r["task_id"], r["sample"]): r for r in records}
    out = skyrl_output([by_key[(f"{t:06d}", s)] for t, s in slots])
    assert [len(x) for x in out["loss_masks"]] == [len(x) for x in out["response_ids"]]
    assert out["rewards"] == [0.0, 0.0, 0.25, 0.0]  # task 1 sample 1 failed: 0.0, masked
    assert sum(out["loss_masks"][3]) == 0 and out["rollout_logprobs"] is not None
