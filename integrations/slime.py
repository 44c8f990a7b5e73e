"""slime: a ``--rollout-function-path`` function and a post-write weights hook
(docs/trainers.md#slime).

``generate_rollout(args, rollout_id, data_source, evaluation=False)`` is what
``RolloutManager`` loads (``slime/ray/rollout.py``; the signature in
``slime/utils/arguments.py``, THUDM/slime@624b824): it takes
``args.rollout_batch_size`` groups of ``n_samples_per_prompt`` samples from the
data source, runs them as one RolloutJob, fills each ``Sample`` in place and
returns ``RolloutFnTrainOutput(samples=groups)`` (``slime/rollout/base_types.py``),
whole groups in order. ``update_weights_hook(args, version_dir, rollout_engines)``
is ``--custom-update-weight-post-write-path``'s signature: it names the checkpoint
slime just wrote as the next batches' ``spec.weights`` and, with ``weights_sync``
``push`` or ``delta``, first pushes it over a process group to the pool's workers
(:class:`~heddle.integrations.WeightPusher`), so they serve it without reloading
from disk. The hook needs no slime, so slime is imported where the rollout
function runs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.exceptions import ConfigError

from ._fields import slime_fields, slime_task
from ._push import PushReport, WeightPusher
from ._rollouts import run_sync
from ._settings import HeddleSettings
from ._shared import rollouts_for

if TYPE_CHECKING:
    from slime.rollout.base_types import RolloutFnTrainOutput

__all__ = ["generate_rollout", "update_weights_hook"]

_lock = threading.Lock()
_pushers: dict[HeddleSettings, WeightPusher] = {}  # one per settings: it keeps the last copy


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput:
    from slime.rollout.base_types import RolloutFnTrainOutput  # noqa: PLC0415
    from slime.utils.types import Sample  # noqa: PLC0415

    if evaluation:
        raise ConfigError(
            "heddle.integrations.slime runs training rollouts; keep slime's own "
            "--eval-function-path for evaluation"
        )
    groups: list[list[Sample]] = data_source.get_samples(args.rollout_batch_size)
    samples = len(groups[0])
    if any(len(g) != samples for g in groups):
        raise ConfigError("slime's groups differ in size; Heddle runs n_samples_per_prompt each")
    tasks = [slime_task(g[0].prompt, g[0].label, g[0].metadata) for g in groups]
    records = run_sync(rollouts_for(HeddleSettings.from_env()).run(tasks, samples))
    by_key = {(r["task_id"], r["sample"]): r for r in records}
    for t, group in enumerate(groups):
        for s, sample in enumerate(group):
            record = by_key.get((f"{t:06d}", s))
            if record is None:  # failed=drop: slime drops a sample it is told to remove
                sample.remove_sample = True
                sample.status = Sample.Status.FAILED
                continue
            fields = slime_fields(record)
            sample.metadata = {**(sample.metadata or {}), "heddle": fields.pop("heddle")}
            status = fields.pop("status")
            for name, value in fields.items():
                setattr(sample, name, value)
            sample.status = Sample.Status(status)
    return RolloutFnTrainOutput(samples=groups)


def update_weights_hook(args: Any, version_dir: str, rollout_engines: Any) -> PushReport | None:
    """Run the next batches on the checkpoint slime just wrote (every rank writes the same);
    with ``weights_sync`` push or delta, the workers get it over a process group first."""
    settings = HeddleSettings.from_env()
    version = Path(version_dir).name
    report = None
    if settings.weights_sync != "disk":
        with _lock:
            pusher = _pushers.setdefault(settings, WeightPusher.from_settings(settings))
        report = run_sync(pusher.push(read_checkpoint(version_dir), version))
    # Named on disk too: a worker that starts later loads it; one that serves it skips it.
    rollouts_for(settings).publish_weights(version_dir, version)
    return report


def read_checkpoint(folder: str) -> dict[str, Any]:
    """The state dict of a Hugging Face checkpoint folder (its ``*.safetensors`` files)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"{folder} holds no .safetensors files to push; let slime write a Hugging Face "
            "checkpoint there or set weights_sync to disk"
        )
    state: dict[str, Any] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state
