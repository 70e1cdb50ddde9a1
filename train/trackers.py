"""Experiment trackers behind one small interface: the trainer writes each metrics record and the resolved
config once; `train.report_to` chooses where they go besides metrics.jsonl (always on).

    jsonl        OUT/metrics.jsonl (train/loop.py, MetricsLog)
    tensorboard  OUT/tensorboard/ event files (torch.utils.tensorboard; needs `pip install tensorboard`)
    wandb        a Weights & Biases run in OUT/wandb/ (needs `pip install wandb`); offline unless WANDB_MODE says
                 otherwise, since most machines running this lab have no network (`wandb sync OUT/wandb/...`
                 uploads later)

A resumed run continues the same tracker run: TensorBoard appends to the same folder and drops the records after
the checkpoint's step (purge_step), wandb resumes the run id saved in the checkpoint (trainer_state.json,
"trackers"). Every numeric field of a record is logged at the record's step as train/KEY or val/KEY.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Protocol

from errors import ConfigError

TRACKERS = ("jsonl", "tensorboard", "wandb")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class Tracker(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def check_report_to(names: list[str]) -> None:
    """Refuse unknown tracker names and trackers whose package is missing, before anything trains."""
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise ConfigError(f"train.report_to: unknown {unknown}; valid trackers are {list(TRACKERS)}")
    for name in names:
        package = PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ConfigError(f"train.report_to includes {name!r} but the {package} package is not installed: "
                              f"pip install {package}")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers under a tag: val/loss for an evaluation, train/KEY otherwise."""
    prefix = "val" if "val_loss" in record else "train"
    return {f"{prefix}/{key.removeprefix('val_')}": float(value) for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


class TensorBoardTracker:
    def __init__(self, out: Path, config: dict[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops the records after the checkpoint a resumed run restarts from (they are redone); those at
        # its step stay, as in metrics.jsonl.
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)
        if not start_step:
            self.writer.add_text("config", "```\n" + _as_text(config) + "\n```", 0)

    def write(self, record: dict[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, int(record.get("step", 0)))

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, out: Path, config: dict[str, Any], run_id: str | None, group: str) -> None:
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "pelab"), dir=str(out), id=run_id,
                              resume="allow" if run_id else None, name=run_name(out), group=group or None,
                              config=config, reinit="create_new")
        self.id = self.run.id

    def write(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        if values:
            self.run.log(values, step=int(record.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


def run_name(out: Path) -> str:
    """A run's name in a tracker: its folder, or for a comparison's OUT/runs/ENCODING/seedS, ENCODING-seedS."""
    return f"{out.parent.name}-{out.name}" if out.name.startswith("seed") else out.name


def log_summary(names: list[str], out: Path, group: str, text: str, values: dict[str, float]) -> None:
    """A comparison's result tables (markdown `text`) and headline numbers, as a run of its own in the group
    (wandb: summary values and the text as an artifact) or as text in OUT/tensorboard (TensorBoard)."""
    check_report_to(names)
    if "tensorboard" in names:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(out / "tensorboard")) as writer:
            writer.add_text("report", text, 0)
            for tag, value in values.items():
                writer.add_scalar(f"summary/{tag}", value, 0)
    if "wandb" in names:
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "pelab"), dir=str(out), name="summary",
                         group=group or None, job_type="summary", reinit="create_new")
        run.summary.update(values)
        artifact = wandb.Artifact("report", type="report")
        with artifact.new_file("table.md") as handle:
            handle.write(text)
        run.log_artifact(artifact)
        run.finish()


def _as_text(config: dict[str, Any]) -> str:
    return "\n".join(f"[{section}]\n" + "\n".join(f"{key} = {value!r}" for key, value in values.items())
                     if isinstance(values, dict) else f"{section} = {values!r}" for section, values in config.items())


class Trackers:
    """The trackers of `train.report_to` other than jsonl, fanned out; `ids` are saved with each checkpoint."""

    def __init__(self, names: list[str], out: Path, config: dict[str, Any], start_step: int, saved: dict | None,
                 group: str = "", enabled: bool = True) -> None:
        check_report_to(names)
        self.trackers: dict[str, Tracker] = {}
        if not enabled:
            return
        saved = saved or {}
        if "tensorboard" in names:
            self.trackers["tensorboard"] = TensorBoardTracker(out, config, start_step)
        if "wandb" in names:
            self.trackers["wandb"] = WandbTracker(out, config, saved.get("wandb") if start_step else None, group)

    @property
    def ids(self) -> dict[str, str]:
        return {name: tracker.id for name, tracker in self.trackers.items() if hasattr(tracker, "id")}

    def write(self, record: dict[str, Any]) -> None:
        for tracker in self.trackers.values():
            tracker.write(record)

    def close(self) -> None:
        for tracker in self.trackers.values():
            tracker.close()
        self.trackers = {}
