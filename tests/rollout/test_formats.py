"""Task rows as verl, slime and SkyRL write them, read as Heddle tasks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from heddle.exceptions import ManifestError
from heddle.rollout import read_tasks

CHAT = [{"role": "user", "content": "What is 2+2?"}]

# The rows each trainer's example preprocessing writes (docs/rollouts.md, "Trainers' task rows").
VERL = {
    "data_source": "openai/gsm8k",
    "prompt": CHAT,
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "4"},
    "extra_info": {"split": "train", "index": 7, "answer": "2+2=4 #### 4"},
}
SLIME = {"prompt": CHAT, "label": "4", "metadata": {"source": "dapo"}}
SKYRL = {
    "data_source": "openai/gsm8k",
    "prompt": CHAT,
    "env_class": "gsm8k",
    "reward_spec": {"method": "rule", "ground_truth": "4"},
    "extra_info": {"split": "train", "index": 8},
}


def _jsonl(tmp_path: Path, *rows: Any) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trainer_rows_become_tasks_and_keep_their_fields(tmp_path: Path) -> None:
    slime_text = {"text": "2+2?", "label": "4"}  # slime's default --input-key
    slime_messages = {"messages": CHAT, "label": "4", "level": 3}
    got = read_tasks(path=_jsonl(tmp_path, VERL, SLIME, SKYRL, slime_text, slime_messages))
    assert got.errors == []
    verl, slime, skyrl, text, messages = got.tasks
    assert verl.id == "7" and skyrl.id == "8"  # extra_info.index names the row
    assert slime.id == "line-2" and text.id == "line-4"
    assert all(t.messages == tuple(CHAT) for t in (verl, slime, skyrl, messages))
    assert text.messages == ({"role": "user", "content": "2+2?"},) and text.fields == {"label": "4"}
    assert verl.fields == {k: v for k, v in VERL.items() if k != "prompt"}
    assert skyrl.fields["reward_spec"] == {"method": "rule", "ground_truth": "4"}
    assert slime.fields == {"label": "4"} and slime.metadata == {"source": "dapo"}
    assert messages.fields == {"label": "4", "level": 3}  # unknown columns kept, not refused


def test_heddle_rows_stay_strict(tmp_path: Path) -> None:
    got = read_tasks(path=_jsonl(tmp_path, {"prompt": "hi", "answer": 4}))
    assert [str(e) for e in got.errors] == [
        f"{tmp_path / 'tasks.jsonl'} line 1: 1 unknown field(s); use id, messages|prompt, "
        "system, metadata, tools"
    ]


@pytest.mark.parametrize(
    ("row", "sentence"),
    [
        (
            {"data_source": "gsm8k", "reward_model": {"ground_truth": "4"}},
            "line 2: this verl/slime/SkyRL row has neither prompt nor messages; give prompt",
        ),
        ({**SLIME, "messages": CHAT}, "line 2: give either prompt or messages, not both"),
        (
            {**VERL, "prompt": [{"role": "user"}]},
            "line 2: messages[0] must have exactly role and content",
        ),
        ({**SLIME, "metadata": [1]}, "line 2: metadata must be an object, got a list"),
    ],
)
def test_bad_trainer_row_names_its_line_and_field(
    tmp_path: Path, row: dict[str, Any], sentence: str
) -> None:
    got = read_tasks(path=_jsonl(tmp_path, SLIME, row))
    assert len(got.tasks) == 1 and len(got.errors) == 1
    assert sentence in str(got.errors[0]) and "\n" not in str(got.errors[0])


def test_parquet_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ManifestError, match="is not a readable parquet file"):
        read_tasks(path=path)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if it were not installed
    with pytest.raises(ManifestError, match="reading one needs pyarrow, which is not installed"):
        read_tasks(path=path)


def test_parquet_rows_read_as_their_jsonl_twins(tmp_path: Path) -> None:
    """verl and SkyRL preprocess into parquet (pandas/datasets over pyarrow): same tasks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for rows in ([VERL, {**VERL, "extra_info": {"split": "train", "index": 9}}], [SKYRL], [SLIME]):
        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        got = read_tasks(path=path)
        want = read_tasks(path=_jsonl(tmp_path, *rows))
        assert got.errors == [] and want.errors == []
        assert [t.messages for t in got.tasks] == [t.messages for t in want.tasks]
        ids = [t.id.replace("row-", "line-") for t in got.tasks]  # a row's number, else its index
        assert ids == [t.id for t in want.tasks]
        # Parquet fills a struct's missing keys with nulls; the row reads as it was written.
        assert [t.fields for t in got.tasks] == [t.fields for t in want.tasks]


def test_parquet_values_json_has_no_type_for_become_strings(tmp_path: Path) -> None:
    import datetime as dt
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    extra = {
        "index": 3,
        "at": dt.datetime(2026, 1, 2, 3, 4, 5),
        "price": decimal.Decimal("1.25"),
        "blob": b"\x00\x01",
    }
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{**VERL, "extra_info": extra}]), path)
    (task,) = read_tasks(path=path).tasks
    assert task.fields["extra_info"] == {
        "index": 3,
        "at": "2026-01-02T03:04:05",
        "price": "1.25",
        "blob": "AAE=",
    }
    json.dumps(task.fields)  # a record and a reward request carry them
