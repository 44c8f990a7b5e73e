"""slime's post-write hook in push mode: the checkpoint slime wrote, pushed over gloo to two
sim workers served over HTTP (the push itself: tests/worker/test_weights_push.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save_file

from heddle.exceptions import ConfigError, WorkerRejectedError
from heddle.integrations import HeddleSettings, WeightPusher
from heddle.integrations.slime import read_checkpoint, update_weights_hook
from tests.worker.test_weights import fake_checkpoint
from tests.worker.test_weights_push import SHAPES, served, state_dict


def write_version(root: Path, name: str, state: dict[str, torch.Tensor]) -> str:
    """What slime writes before calling the hook: a Hugging Face checkpoint folder."""
    folder = root / name
    folder.mkdir(parents=True)
    save_file({n: t.contiguous() for n, t in state.items()}, str(folder / "model.safetensors"))
    return str(folder)


def push_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str, urls: list[str]) -> None:
    monkeypatch.setenv("HEDDLE_JOB", str(tmp_path / "job.yaml"))
    monkeypatch.setenv("HEDDLE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("HEDDLE_WEIGHTS_SYNC", mode)
    monkeypatch.setenv("HEDDLE_PUSH_WORKERS", ",".join(urls))


async def versions(urls: list[str]) -> list[str | None]:
    async with httpx.AsyncClient() as http:
        return [(await http.get(f"{u}/v1/state")).json()["weight_version"] for u in urls]


@pytest.mark.anyio
async def test_slime_hook_pushes_in_full_then_only_the_changed_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_checkpoint(tmp_path / "model", SHAPES)
    async with served(model) as w0, served(model) as w1:
        urls = [w0.url, w1.url]
        push_env(monkeypatch, tmp_path, "delta", urls)
        old = state_dict(0)
        first = await asyncio.to_thread(
            update_weights_hook, None, write_version(tmp_path / "ckpt", "iter_0000010", old), None
        )
        assert first is not None and first.delta is False
        full_bytes = sum(t.numel() * 4 for t in old.values())
        assert [r["bytes"] for r in first.results] == [full_bytes, full_bytes]
        assert await versions(urls) == ["iter_0000010", "iter_0000010"]
        published = json.loads((tmp_path / "work" / "weights.json").read_text())
        assert published["version"] == "iter_0000010"

        new = {**old, "model.norm.weight": old["model.norm.weight"] * 2}
        second = await asyncio.to_thread(
            update_weights_hook, None, write_version(tmp_path / "ckpt", "iter_0000020", new), None
        )
        assert second is not None and second.delta is True
        assert second.names == ("model.norm.weight",)
        assert [r["tensors"] for r in second.results] == [1, 1]
        assert second.bytes == 2 * 16 * 4  # only the changed tensor travelled, to each worker
        assert await versions(urls) == ["iter_0000020", "iter_0000020"]

        # Nothing changed: the smallest tensor carries the new version to every worker.
        same = await asyncio.to_thread(
            update_weights_hook, None, write_version(tmp_path / "ckpt", "iter_0000030", new), None
        )
        assert same is not None and same.names == ("model.norm.weight",)
        assert await versions(urls) == ["iter_0000030", "iter_0000030"]


@pytest.mark.anyio
async def test_a_wrong_shape_is_refused_in_one_sentence_and_nothing_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_checkpoint(tmp_path / "model", SHAPES)
    async with served(model) as w0:
        push_env(monkeypatch, tmp_path, "push", [w0.url])
        wrong = {**state_dict(0), "model.norm.weight": torch.zeros(17)}
        folder = write_version(tmp_path / "ckpt", "iter_0000001", wrong)
        with pytest.raises(WorkerRejectedError) as caught:
            await asyncio.to_thread(update_weights_hook, None, folder, None)
        message = str(caught.value)
        assert "tensor model.norm.weight has shape [17], the running model's has [16]" in message
        assert "\n" not in message
        assert await versions([w0.url]) == [None]
        assert not (tmp_path / "work" / "weights.json").exists()
        # A full-mode pusher keeps no copy: the next good version goes in full.
        good = write_version(tmp_path / "ckpt", "iter_0000002", state_dict(1))
        report = await asyncio.to_thread(update_weights_hook, None, good, None)
        assert report is not None and report.delta is False and len(report.names) == len(SHAPES)
        assert await versions([w0.url]) == ["iter_0000002"]


def test_push_settings_and_checkpoints_that_do_not_fit_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="weights_sync delta needs push_workers"):
        HeddleSettings(job="job.yaml", weights_sync="delta")
    with pytest.raises(ConfigError, match="weights_sync 'ssh' is not one of disk, push, delta"):
        HeddleSettings(job="job.yaml", weights_sync="ssh")
    with pytest.raises(ConfigError, match="weights_sync is disk"):
        WeightPusher.from_settings(HeddleSettings(job="job.yaml"))
    empty = tmp_path / "iter_1"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"holds no \.safetensors files to push"):
        read_checkpoint(str(empty))
