"""Models another comparison already trained (compare.reuse): a variant whose folder holds no model yet takes a
finished model of one of those comparisons instead of training it, where that model was trained with the same
settings on byte-identical data. Training is deterministic given its settings, data and seed (the same code trains
the same weights), so the copy is the model this comparison would train; a learning-rate sweep's models at the
chosen rates, for example, become a preset's without training them twice.
"""
from __future__ import annotations

import copy
import filecmp
import json
import os
import shutil
from pathlib import Path

from errors import DataError
from experiments.compare.layout import run_dir
from experiments.jobs import comparable, saved_run_config
from model.checkpoint import (
    DATA_FOLDER,
    READY,
    STAGING,
    TRAINER_STATE,
    data_folder_record,
    has_checkpoint,
    load_trainer_state,
    training_data_dir,
)
from train.config import RunConfig, to_toml
from train.loop import RUN_CONFIG, SNAPSHOTS

DATA_FILES = ("train.bin", "val.bin", "tokenizer.json")  # what a prepared folder's tokens and their meaning are


def same_data(one: Path, other: Path) -> bool:
    """Whether two prepared data folders hold the same tokens, split and tokenizer, byte for byte."""
    if one.resolve() == other.resolve():
        return True
    return all((one / name).exists() and (other / name).exists() and filecmp.cmp(one / name, other / name, shallow=False)
               for name in DATA_FILES)


def as_trained_here(saved: dict, config: RunConfig) -> dict:
    """A saved run's settings with its folders (data.dir, out.dir) replaced by this comparison's."""
    moved = copy.deepcopy(saved)
    moved["data"]["dir"] = config.data.dir
    moved["out"]["dir"] = config.out.dir
    return moved


def reusable(source: Path, config: RunConfig) -> bool:
    """Whether `source` holds a finished model trained as `config` would train it, on the same data, and no save
    is in progress there."""
    if not has_checkpoint(source) or (source / READY).exists() or (source / STAGING).exists():
        return False
    saved = saved_run_config(source)
    if saved is None or int(load_trainer_state(source)["step"]) < config.train.max_steps:
        return False
    if comparable(as_trained_here(saved, config)) != comparable(config.to_dict()):
        return False
    try:
        trained_on = Path(training_data_dir(source))  # wherever the run is started from
    except DataError:
        return False
    return same_data(trained_on, Path(config.data.dir))


def rewrite_state(folder: Path, config: RunConfig, final: Path) -> None:
    """Point a copied checkpoint's saved settings and data-folder record at this comparison's folders (`final`:
    where the checkpoint will live)."""
    state = json.loads((folder / TRAINER_STATE).read_text())
    state["run_config"] = config.to_dict()
    state[DATA_FOLDER] = data_folder_record(config.data.dir, final)
    (folder / TRAINER_STATE).write_text(json.dumps(state, indent=2) + "\n")


def reuse_trained(config: RunConfig, encoding: str, seed: int, folders: list[str]) -> str | None:
    """Copy the first reusable model of `folders` (other comparisons' output folders) into this variant's folder;
    returns what was done, or None where none is reusable. The copy is assembled beside the folder and moved into
    place in one rename, so an interrupted copy leaves no half model."""
    out = Path(config.out.dir)
    if has_checkpoint(out):
        return None
    for folder in folders:
        source = run_dir(folder, encoding, seed)
        if source.resolve() == out.resolve() or not reusable(source, config):
            continue
        staging = out.parent / f".{out.name}.reusing"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        rewrite_state(staging, config, out)
        for snapshot in sorted((staging / SNAPSHOTS).glob("step-*")):
            rewrite_state(snapshot, config, out / SNAPSHOTS / snapshot.name)
        (staging / RUN_CONFIG).write_text(to_toml(config))
        shutil.rmtree(out, ignore_errors=True)  # no model there (checked above): at most a run that never saved
        os.replace(staging, out)
        return f"reused (trained in {folder})"
    return None
