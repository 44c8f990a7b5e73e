"""``heddle export``: a rollout output in a trainer's sample shape (docs/cli.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_export_parser"]

_TRAINERS = ("verl", "slime", "skyrl", "openrlhf")  # the keys of _export.TRAINERS (a test checks)


def _cmd_export(args: argparse.Namespace) -> int:
    from heddle.rollout import write_export  # noqa: PLC0415 - numpy only when exporting

    count = write_export(args.input, args.output, args.to, keep_failed=args.keep_failed)
    print(f"heddle export: wrote {count} {args.to} rows to {args.output}", file=sys.stderr)
    return 0


def add_export_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="turn a rollout output into a trainer's samples (verl, slime, SkyRL, OpenRLHF)",
        description=(
            "Write one JSON line per trajectory in the trainer's field names, ordered by "
            "task index then sample (docs/rollouts.md, 'Export to a trainer')."
        ),
    )
    p.add_argument("--to", required=True, choices=_TRAINERS, help="the trainer")
    p.add_argument("input", type=Path, metavar="IN", help="a Heddle output JSONL")
    p.add_argument("output", type=Path, metavar="OUT", help="the JSONL to write")
    p.add_argument(
        "--keep-failed",
        action="store_true",
        help="keep failed trajectories (left out by default: no reward, may stop mid-turn)",
    )
    p.set_defaults(func=_cmd_export)
