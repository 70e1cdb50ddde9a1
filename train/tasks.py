"""Training one model on a synthetic task (data/tasks.py): batches whose loss counts the answer targets only, and a
training that reuses or resumes what an earlier one with the same settings left in its folder.

Every model of a task trains on the same sequences for a seed (a function of the seed and the step); the validation
batches (the validation loss, and the stop check a caller passes) come from VALIDATION_SEED, which no training batch
and no test sequence uses.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterator

import torch

from data.batches import IGNORE_INDEX
from data.tasks import EVAL_SEED, Task, TaskBatch
from errors import ConfigError
from model.checkpoint import has_checkpoint, load_trainer_state
from train.config import RunConfig, build_run_config
from train.loop import StopCheck, Training, model_factory, run_training

VALIDATION_SEED = EVAL_SEED - 1
# How a run reports and computes, not what it trains: a resumed run may change them.
EXECUTION = ("report_to", "tracker_group", "compile", "fused_loss")


class TaskBatches:
    """The training loop's batch source for a task: loss only on the answer targets."""

    def __init__(self, task: Task, length: int, batch_size: int, seed: int, val_batches: int) -> None:
        self.task, self.length, self.batch_size, self.seed, self.val_batches = task, length, batch_size, seed, val_batches

    @staticmethod
    def masked(batch: TaskBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.inputs, torch.where(batch.answers, batch.targets, torch.full_like(batch.targets, IGNORE_INDEX))

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.masked(self.task.batch([self.seed, step, micro_step], self.batch_size, self.length, train=True))

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.val_batches):
            yield self.masked(self.task.batch([VALIDATION_SEED, index], self.batch_size, self.length, train=True))


def comparable(settings: dict) -> dict:
    """A run's settings without EXECUTION's."""
    return {**settings, "train": {k: v for k, v in settings.get("train", {}).items() if k not in EXECUTION}}


def earlier_training(config: RunConfig, until: float | None) -> tuple[str | None, dict]:
    """What an earlier run left in config.out.dir, and its trainer state: "done" (a training with these settings and
    stop target that reached its target or train.max_steps: reused, not retrained), "partial" (the same training
    interrupted after a checkpoint: resumed from it), or None (nothing usable: trained afresh)."""
    out = Path(config.out.dir)
    if not has_checkpoint(out):
        return None, {}
    state = load_trainer_state(out)
    try:
        saved = build_run_config(copy.deepcopy(state.get("run_config")), str(out), saved=True).to_dict()
    except (ConfigError, TypeError, AttributeError):
        return None, {}
    if comparable(saved) != comparable(config.to_dict()) or state.get("until", "unrecorded") != until:
        return None, {}
    finished = int(state.get("step", 0)) >= config.train.max_steps or (until is not None and "stopped" in state)
    return ("done" if finished else "partial"), state


def train_task(config: RunConfig, task: Task, length: int, until: float | None,
               stop_when: StopCheck | None) -> tuple[int, bool | None]:
    """Train config's model on `task` at `length` into config.out.dir (out.overwrite: an earlier run with other
    settings is replaced), until `stop_when` gives a reason to stop or train.max_steps; an earlier training with the
    same settings and stop target `until` is reused, or resumed when it was interrupted. Returns the steps trained
    and whether the target was reached (None without one)."""
    earlier, state = earlier_training(config, until)
    if earlier == "done":
        print(f"reusing the finished training in {config.out.dir} (step {state['step']})", flush=True)
        return int(state["step"]), None if until is None else "stopped" in state
    batches = TaskBatches(task, length, config.train.batch_size, config.train.seed, config.train.eval_batches)
    trained = run_training(Training(config, model_factory(config, None), batches, None, resume=earlier == "partial",
                                    task=f"task:{task.name}", extra_state={"until": until},
                                    stop_when=None if until is None else stop_when))
    return trained.steps, None if until is None else trained.stopped is not None
