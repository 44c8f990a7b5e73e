"""A picture of one rollout from its output JSONL (``heddle run --plot``)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["plot_rollout"]


def plot_rollout(output: Path, png: Path) -> Path:
    """Finished trajectories over time, their lengths, and (if scored) their rewards."""
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
    scored = [r for r in records if r.get("reward") is not None]
    fig, axes = plt.subplots(1, 3 if scored else 2, figsize=(16 if scored else 11, 4))
    left, middle = axes[0], axes[1]
    left.step(finish, range(1, len(finish) + 1), where="post")
    left.set(xlabel="seconds since the first trajectory started", ylabel="trajectories finished")
    left.set_title("completion (the long tail sets the makespan)")
    bins = min(40, max(5, len(lengths) // 4))
    if scored:
        # Lengths split by reward: does the model get it right when it writes more, or less?
        good = [r["tokens"]["generated"] for r in scored if r["reward"] > 0]
        bad = [r["tokens"]["generated"] for r in scored if r["reward"] <= 0]
        middle.hist([bad, good], bins=bins, stacked=True, label=["reward 0", "reward > 0"])
        middle.legend()
    else:
        middle.hist(lengths, bins=bins)
    middle.set(xlabel="generated tokens per trajectory", ylabel="trajectories")
    middle.set_title(f"{len(records)} trajectories")
    if scored:
        groups: dict[str, list[float]] = {}
        for r in scored:
            groups.setdefault(str(r["task_id"]), []).append(float(r["reward"]))
        means = sorted((sum(g) / len(g) for g in groups.values()), reverse=True)
        right = axes[2]
        right.bar(range(len(means)), means)
        mean = sum(float(r["reward"]) for r in scored) / len(scored)
        right.axhline(mean, color="black", linestyle="--", label=f"mean {mean:.2f}")
        right.set(xlabel="task (GRPO group), best first", ylabel="mean reward of its samples")
        right.set_title(f"rewards: {len(scored)} scored, {len(groups)} groups")
        right.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png
