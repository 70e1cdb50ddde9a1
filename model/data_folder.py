"""Where a checkpoint's training data folder is, from any working directory.

A training run names its data folder as given (`data.dir`, often relative to the directory it was started from).
Each save also records the folder as an absolute path and as a path relative to the checkpoint folder
(trainer_state["data_folder"]), so an evaluation started elsewhere, or a run folder moved together with its data,
still finds it. `training_data_dir` is the one reader: every command that defaults to a checkpoint's own data
calls it.
"""
from __future__ import annotations

import os
from pathlib import Path

from errors import CheckpointError, DataError
from model.checkpoint import load_trainer_state

DATA_FOLDER = "data_folder"  # the trainer_state key of the record


def data_folder_record(data_dir: str | Path, checkpoint: str | Path) -> dict[str, str]:
    """What a save of `checkpoint` records about the data folder it trained on (relative paths are taken from the
    current directory, as the run read them)."""
    absolute = Path(data_dir).resolve()
    return {"path": str(absolute), "relative_to_checkpoint": os.path.relpath(absolute, Path(checkpoint).resolve())}


def data_folder_candidates(checkpoint: str | Path) -> list[tuple[Path, str]]:
    """(path, where it comes from) for each place the checkpoint's data folder may be, in the order tried: the
    recorded absolute path, the recorded path relative to the checkpoint folder, then the run config's data.dir
    from the current directory (all that a checkpoint saved before the record holds)."""
    try:
        state = load_trainer_state(checkpoint)
    except CheckpointError:
        return []
    candidates: list[tuple[Path, str]] = []
    record = state.get(DATA_FOLDER) or {}
    if record.get("path"):
        candidates.append((Path(record["path"]), "recorded"))
    if record.get("relative_to_checkpoint"):
        candidates.append((Path(checkpoint) / record["relative_to_checkpoint"], "relative to the checkpoint"))
    configured = state.get("run_config", {}).get("data", {}).get("dir")
    if configured:
        where = "the run's data.dir" if Path(configured).is_absolute() else \
            f"the run's data.dir, from the current directory {Path.cwd()}"
        candidates.append((Path(configured), where))
    unique: dict[Path, str] = {}
    for path, where in candidates:
        unique.setdefault(path, where)
    return list(unique.items())


def training_data_dir(checkpoint: str | Path) -> str:
    """The prepared data folder the checkpoint was trained on: the first candidate that holds a meta.json.
    Raises DataError naming every path tried and the --data flag to pass instead."""
    candidates = data_folder_candidates(checkpoint)
    if not candidates:
        raise DataError(
            f"{checkpoint} does not record the data it was trained on (e.g. it was imported); pass --data: "
            "a prepared folder, a named source or a text path"
        )
    for path, _ in candidates:
        if (path / "meta.json").is_file():
            return str(path)
    tried = "; ".join(f"{path} ({where})" for path, where in candidates)
    raise DataError(
        f"{checkpoint}: its training data folder is not found here; tried {tried}. Pass --data DIR with the prepared "
        "folder it was trained on (or a named source or a text path to evaluate on)"
    )
