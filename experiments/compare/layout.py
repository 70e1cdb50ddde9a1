"""Where a comparison keeps what it makes, under its output folder OUT (compare.out)."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from model.checkpoint import WEIGHTS


def run_dir(out: str | Path, encoding: str, seed: int) -> Path:
    """OUT/runs/ENCODING/seedS: one variant's checkpoint folder."""
    return Path(out) / "runs" / encoding / f"seed{seed}"


def eval_path(out: str | Path, encoding: str, seed: int, step: int | None = None) -> Path:
    """OUT/evals/ENCODING/seedS[-stepN].npz: the cached per-token evaluation of a variant (or of its snapshot)."""
    suffix = "" if step is None else f"-step{step}"
    return Path(out) / "evals" / encoding / f"seed{seed}{suffix}.npz"


def probe_path(out: str | Path, encoding: str, seed: int, probe: str, step: int | None = None) -> Path:
    """OUT/probes/ENCODING/seedS[-stepN]-PROBE.json: one probe's results on one trained model (or its snapshot)."""
    suffix = "" if step is None else f"-step{step}"
    return Path(out) / "probes" / encoding / f"seed{seed}{suffix}-{probe}.json"


def weights_digest(checkpoint: Path) -> str:
    """The first 16 hex digits of the SHA-256 of a checkpoint's weights: what a cached evaluation or probe keys on."""
    return hashlib.sha256((checkpoint / WEIGHTS).read_bytes()).hexdigest()[:16]


def task_path(out: str | Path, task: str) -> Path:
    """OUT/tasks/TASK/results.json: one synthetic task's results for every encoding and seed."""
    return Path(out) / "tasks" / task / "results.json"


def invocations(out: str | Path) -> list[dict]:
    """Every invocation on record in OUT/invocations.jsonl, oldest first (each appends its line as it finishes, so
    a report rebuilt from the cache still gives the wall time of the invocations that trained and evaluated)."""
    path = Path(out) / "invocations.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record_invocation(out: str | Path, command: str, wall_s: float, **details: object) -> None:
    """Append an invocation (its command, wall time, when it finished, and `details`) to OUT/invocations.jsonl."""
    record = {"command": command, "wall_s": round(wall_s, 1), **details, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(Path(out) / "invocations.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")
