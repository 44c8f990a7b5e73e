"""``heddle export``: a rollout output in a trainer's sample shape (docs/cli.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_export_parser"]

# The keys of _export.TRAINERS and its FAILED_ROWS (a test checks): the CLI starts without numpy.
_TRAINERS = ("verl", "slime", "skyrl", "openrlhf", "areal", "roll")
_FAILED = ("placeholder", "drop", "keep")


def _cmd_export(args: argparse.Namespace) -> int:
    from heddle.rollout import write_export  # noqa: PLC0415 - numpy only when exporting

    failed = "keep" if args.keep_failed else args.failed
    count = write_export(args.input, args.output, args.to, failed=failed)
    print(f"heddle export: wrote {count} {args.to} rows to {args.output}", file=sys.stderr)
    return 0


def add_export_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="turn a rollout output into a trainer's samples (verl, slime, SkyRL, OpenRLHF, "
        "AReaL, ROLL)",
        description=(
            "Write one JSON line per (task, sample) in the trainer's field names, ordered by "
            "task index then sample, whole groups: a failed or missing trajectory is a "
            "placeholder row with its mask all zero (docs/rollouts.md, 'Export to a trainer')."
        ),
    )
    p.add_argument("--to", required=True, choices=_TRAINERS, help="the trainer")
    p.add_argument("input", type=Path, metavar="IN", help="a Heddle output JSONL")
    p.add_argument("output", type=Path, metavar="OUT", help="the JSONL to write")
    p.add_argument(
        "--failed",
        choices=_FAILED,
        default="placeholder",
        help="a failed trajectory's row: placeholder (mask all zero, reward null; default), "
        "drop (left out: groups come short), keep (as written)",
    )
    p.add_argument("--keep-failed", action="store_true", help="the same as --failed keep")
    p.set_defaults(func=_cmd_export)
