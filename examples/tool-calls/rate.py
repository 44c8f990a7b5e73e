"""How often the model emitted a valid tool call: read a tools job's output.

    python examples/tool-calls/rate.py examples/tool-calls/out/rollout.jsonl

A trajectory *emitted a valid call* when vLLM's parser found at least one call
in its first turn and the tool ran it without error (the record's
``tool_calls`` above its ``tool_errors``); *tried* counts first turns that hold
the ``<tool_call>`` tag at all, parsed or not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def first_turn(record: dict[str, Any]) -> dict[str, Any]:
    return next(m for m in record["messages"] if m.get("role") == "assistant")


def rates(records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    valid = sum(1 for r in records if r["tool_calls"] > r["tool_errors"])
    parsed = sum(1 for r in records if first_turn(r).get("tool_calls"))
    tried = sum(
        1
        for r in records
        if first_turn(r).get("tool_calls") or "<tool_call>" in str(first_turn(r)["content"] or "")
    )
    answered = sum(1 for r in records if r["turns"] > 1 and r["tool_calls"] > r["tool_errors"])
    return {"trajectories": n, "valid_calls": valid, "parsed_calls": parsed, "tried": tried,
            "continued_after_reply": answered, "valid_rate": valid / n if n else 0.0}  # fmt: skip


if __name__ == "__main__":
    rows = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
    r = rates(rows)
    print(
        f"{r['valid_calls']}/{r['trajectories']} trajectories emitted a valid tool call "
        f"({r['valid_rate']:.0%}); {r['parsed_calls']} parsed, {r['tried']} wrote <tool_call>; "
        f"{r['continued_after_reply']} took another turn after the tool's reply"
    )
