"""A picture of one rollout from its output JSONL (``heddle run --plot``)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["plot_rollout"]


def plot_rollout(output: Path, png: Path) -> Path:
    """Finished trajectories over time, and the distribution of their lengths."""
    import matplotlib  # noqa: PLC0415 - the plot extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    text = output.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.split("\n") if line.strip()]  # "\n" only
    if not records:
        raise ValueError(f"{output} holds no records to plot")
    start = min(r["timings"]["started_at"] for r in records)
    finish = sorted(r["timings"]["finished_at"] - start for r in records)
    lengths = sorted(r["tokens"]["generated"] for r in records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.step(finish, range(1, len(finish) + 1), where="post")
    left.set(xlabel="seconds since the first trajectory started", ylabel="trajectories finished")
    left.set_title("completion (the long tail sets the makespan)")
    right.hist(lengths, bins=min(40, max(5, len(lengths) // 4)))
    right.set(xlabel="generated tokens per trajectory", ylabel="trajectories")
    right.set_title(f"{len(records)} trajectories")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
