"""Checking a checkpoint before an engine loads it in place.

vLLM's in-place reload copies tensors layer by layer into the live model; a
checkpoint that does not fit (another architecture, other shapes) fails half
way and leaves the engine dead (seen with vLLM 0.32 on the CPU build). So the
worker reads only the safetensors headers (a few KiB, no tensor data) and
compares names and shapes with the checkpoint the engine started from; a
checkpoint that differs is refused with a sentence and the old weights keep
serving.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.exceptions import CheckpointError

__all__ = [
    "CheckpointLayout",
    "LoadedWeights",
    "check_compatible",
    "checkpoint_dir",
    "checkpoint_layout",
    "weights_path",
]

_MAX_HEADER_BYTES = 100 * 2**20  # the safetensors format's own cap on the JSON header
MAX_CONFIG_BYTES = 2**20  # a config.json is a few KiB; a larger one is not a checkpoint's


def weights_path(path: str, roots: Sequence[str]) -> str:
    """``path`` with symlinks and ``..`` resolved, if it lies under one of ``roots``.

    Whoever holds the pool's token may ask for a load, so the worker reads only where
    its checkpoints live (the volumes it mounts): not /etc, /proc or the way up with
    ``..``. The refusal is the same whether the path exists or not, so it tells the
    caller nothing about the worker's files.
    """
    if not roots:
        raise CheckpointError(
            f"checkpoint {path}: this worker loads checkpoints in place only under its "
            "weights roots, and it has none (heddle worker --weights-root DIR; the operator "
            "passes the mount paths of the pool's volumes)"
        )
    real = os.path.realpath(path) if "\x00" not in path else ""
    for root in roots:
        top = os.path.realpath(root)
        if real and (real == top or real.startswith(top.rstrip("/") + "/")):
            return real
    raise CheckpointError(
        f"checkpoint {path} is not under this worker's weights roots {sorted(roots)}; save "
        "checkpoints on a volume the workers mount there"
    )


@dataclass(frozen=True)
class LoadedWeights:
    """What an engine serves: where its weights came from and the version the trainer gave."""

    path: str
    version: str | None  # None: the weights the worker started with, unversioned
    load_s: float = 0.0  # how long the in-place load took (0 for the start-up weights)


@dataclass(frozen=True)
class CheckpointLayout:
    """The parts of a checkpoint an in-place load depends on."""

    path: str
    architectures: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape, over every safetensors file


def _header(file: Path) -> dict[str, Any]:
    with file.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"checkpoint file {file} is not a safetensors file (too short)")
        (size,) = struct.unpack("<Q", raw)
        if size > _MAX_HEADER_BYTES:
            raise CheckpointError(f"checkpoint file {file} is not a safetensors file (bad header)")
        try:
            header = json.loads(f.read(size))
        except ValueError:
            raise CheckpointError(
                f"checkpoint file {file} is not a safetensors file (its header is not JSON)"
            ) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint file {file} is not a safetensors file (bad header)")
    return header


def checkpoint_dir(path: str) -> Path:
    """``path`` as a directory, or :class:`CheckpointError` saying what to give instead."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint {path} does not exist or is not a directory; give the directory "
            "holding config.json and *.safetensors, on a volume the workers mount"
        )
    return root


def checkpoint_layout(path: str) -> CheckpointLayout:
    """Architectures (config.json) and tensor shapes (safetensors headers) of ``path``."""
    root = checkpoint_dir(path)
    config_file = root / "config.json"
    try:
        with config_file.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise CheckpointError(
                f"checkpoint {path}: config.json is over {MAX_CONFIG_BYTES} bytes; it is not a "
                "model's config"
            )
        config = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no config.json") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {path}: config.json cannot be read: {exc}") from None
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"checkpoint {path} holds no *.safetensors files; save it with "
            "save_pretrained(..., safe_serialization=True)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, entry in _header(file).items():
            if name != "__metadata__" and isinstance(entry, dict):
                shapes[name] = tuple(int(d) for d in entry.get("shape", ()))
    architectures = config.get("architectures") if isinstance(config, dict) else None
    return CheckpointLayout(path, tuple(architectures or ()), shapes)


def check_compatible(new: CheckpointLayout, running: CheckpointLayout) -> None:
    """Raise :class:`CheckpointError` unless ``new`` fits the model the engine runs."""
    if new.architectures != running.architectures:
        raise CheckpointError(
            f"checkpoint {new.path} is a {'/'.join(new.architectures) or 'model of no stated'} "
            f"architecture, the engine runs {'/'.join(running.architectures)}; "
            "in-place loading keeps the architecture, so save the checkpoint from the same model"
        )
    missing = sorted(set(running.shapes) - set(new.shapes))
    extra = sorted(set(new.shapes) - set(running.shapes))
    if missing or extra:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
        raise CheckpointError(
            f"checkpoint {new.path} does not have the running model's tensors ({detail}, "
            f"{len(missing)} missing and {len(extra)} unexpected in all); it is another model"
        )
    for name, shape in running.shapes.items():
        if new.shapes[name] != shape:
            raise CheckpointError(
                f"checkpoint {new.path}: tensor {name} has shape {list(new.shapes[name])}, "
                f"the running model's has {list(shape)}; it is another model size"
            )
