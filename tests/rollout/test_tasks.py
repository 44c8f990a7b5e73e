"""Task sets: every malformed line is reported with its number; the valid ones go on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heddle.exceptions import ManifestError
from heddle.rollout import read_tasks


def test_jsonl_tasks_with_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"id": "a", "prompt": "add 2 and 2"}',
                "{not json",
                '{"id": "b", "messages": [{"role": "user", "content": "hi"}], '
                '"system": "be brief"}',
                '["a", "list"]',
                '{"id": "c"}',
                "",
                '{"id": "a", "prompt": "again"}',
                '{"id": 7, "prompt": "numeric id", "metadata": {"answer": 4}}',
                '{"id": "d", "messages": [{"role": "robot", "content": "x"}]}',
            ]
        )
    )
    result = read_tasks(path=path)
    assert [t.id for t in result.tasks] == ["a", "b", "7"]
    assert result.tasks[1].messages[0] == {"role": "system", "content": "be brief"}
    assert result.tasks[2].metadata == {"answer": 4}
    where = [e.where for e in result.errors]
    assert where == [f"{path} line {n}" for n in (2, 4, 5, 7, 9)]
    reasons = " | ".join(e.reason for e in result.errors)
    assert "not valid JSON" in reasons
    assert "must be a JSON object" in reasons
    assert "either messages" in reasons
    assert "repeats the task" in reasons
    assert "role must be one of" in reasons


def test_inline_tasks_get_default_ids() -> None:
    result = read_tasks(inline=[{"prompt": "x"}, {"prompt": "y"}, {"prompt": ""}])
    assert [t.id for t in result.tasks] == ["task-0", "task-1"]
    assert result.errors[0].where == "tasks.inline[2]"


def test_missing_task_file_says_which(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"cannot read the task file .*spec\.tasks\.path"):
        read_tasks(path=tmp_path / "nope.jsonl")


def test_line_separators_inside_json_strings_do_not_split_a_task(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [
        json.dumps({"prompt": "one\u2028two"}, ensure_ascii=False),
        json.dumps({"prompt": "three\x85four"}, ensure_ascii=False),
        json.dumps({"prompt": "five\u2029six\x1c"}, ensure_ascii=False),
        "{broken",
    ]
    path.write_text("\ufeff" + "\n".join(lines) + "\r\n", encoding="utf-8")  # a BOM, CRLF end
    result = read_tasks(path=path)
    assert [t.id for t in result.tasks] == ["line-1", "line-2", "line-3"]
    assert result.tasks[0].messages[0]["content"] == "one\u2028two"
    assert [e.where for e in result.errors] == [f"{path} line 4"]


def test_errors_about_a_file_never_quote_it(tmp_path: Path) -> None:
    secret = "s3cr3t-value"
    path = tmp_path / "tasks.jsonl"
    rows = [
        secret,
        json.dumps({"id": [secret], "prompt": secret}),
        json.dumps({"id": "a", secret: 1, "prompt": "x"}),
        json.dumps({"id": "b", "prompt": [secret]}),
        json.dumps({"id": "c", "messages": [{"role": secret, "content": secret}]}),
        json.dumps({"id": "d", "messages": [{"text": secret}]}),
        json.dumps({"id": "e", "prompt": "x", "system": [secret], "metadata": secret}),
        json.dumps({"id": "f", "prompt": "x", "metadata": secret}),
        json.dumps([secret]),
    ]
    path.write_text("\n".join(rows) + "\n")
    result = read_tasks(path=path)
    assert result.tasks == [] and len(result.errors) == len(rows)
    assert not any(secret in str(e) for e in result.errors), [str(e) for e in result.errors]
