"""Where a comparison keeps what it makes, under its output folder OUT (compare.out)."""
from __future__ import annotations

from pathlib import Path


def run_dir(out: str | Path, encoding: str, seed: int) -> Path:
    """OUT/runs/ENCODING/seedS: one variant's checkpoint folder."""
    return Path(out) / "runs" / encoding / f"seed{seed}"


def eval_path(out: str | Path, encoding: str, seed: int, step: int | None = None) -> Path:
    """OUT/evals/ENCODING/seedS[-stepN].npz: the cached per-token evaluation of a variant (or of its snapshot)."""
    suffix = "" if step is None else f"-step{step}"
    return Path(out) / "evals" / encoding / f"seed{seed}{suffix}.npz"


def probe_path(out: str | Path, encoding: str, seed: int, probe: str) -> Path:
    """OUT/probes/ENCODING/seedS-PROBE.json: one probe's results on one trained model."""
    return Path(out) / "probes" / encoding / f"seed{seed}-{probe}.json"


def task_path(out: str | Path, task: str) -> Path:
    """OUT/tasks/TASK/results.json: one synthetic task's results for every encoding and seed."""
    return Path(out) / "tasks" / task / "results.json"
