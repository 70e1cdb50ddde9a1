"""Checkpoint folders: model.safetensors + config.json + tokenizer files + trainer_state.json (+ training_state.pt).

Saving is atomic as a whole: files are written to OUT/.staging, the folder is renamed to OUT/.ready (the
commit point), then each file is moved into OUT and .ready is removed. A crash before the commit leaves the
previous checkpoint untouched; a crash after it is rolled forward by the next save (only a writer changes the
folder: `recover`, called by the trainer before it resumes, and every save).
Reading never modifies the folder. A read sees one save's files: while a save is committed but not yet moved
into place, the new files are read from .ready (and OUT for those already moved); a read during which the
folder changed is retried. So any number of readers can load a run that is saving.
Loading never unpickles code: weights come from safetensors, state from JSON or torch.load(weights_only=True).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors

from commands import nearby_folder
from errors import CheckpointError, DataError
from model.config import ModelConfig
from model.runtime_config import RuntimeConfig
from model.transformer import Transformer

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TRAINER_STATE = "trainer_state.json"
TRAINING_STATE = "training_state.pt"  # optimizer state and RNG states
STAGING = ".staging"
READY = ".ready"
T = TypeVar("T")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def recover(folder: str | Path) -> None:
    """For the writer of `folder` only: finish its save that reached the commit point, drop one that did not."""
    _roll_forward(Path(folder))


def _roll_forward(folder: Path) -> None:
    """Finish a save that reached its commit point; drop one that did not."""
    ready = folder / READY
    if ready.is_dir():
        for path in sorted(ready.iterdir()):
            try:
                os.replace(path, folder / path.name)
            except FileNotFoundError:  # another process finished the move
                pass
        shutil.rmtree(ready, ignore_errors=True)
    shutil.rmtree(folder / STAGING, ignore_errors=True)


def write_atomically(folder: str | Path, writers: dict[str, Callable[[Path], None]]) -> None:
    """Write a set of files into `folder` so that readers see either all old or all new files.

    writers: file name -> function that writes that file at the given path ("" writes a whole set of files
    into the given folder, e.g. a tokenizer's save_pretrained).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _roll_forward(folder)
    staging = folder / STAGING
    try:
        staging.mkdir()
        for name, write in writers.items():
            write(staging / name if name else staging)
        for path in staging.iterdir():
            _fsync_file(path)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)  # the previous checkpoint was never touched
        if is_write_failure(error):
            raise CheckpointError(f"could not write a checkpoint to {folder} ({error}); the last complete one there "
                                  "is intact: free space (or fix the folder) and continue with --resume") from error
        raise
    os.replace(staging, folder / READY)
    _roll_forward(folder)


def is_write_failure(error: BaseException) -> bool:
    """An error of the file system (a full disk, a quota, a read-only folder), also as torch and safetensors
    report it, rather than a bug."""
    if isinstance(error, OSError):
        return True
    return isinstance(error, SafetensorError) and "os error" in str(error)


def _folder_state(folder: Path) -> tuple:
    """What a save changes, as seen by a reader: the committed files and their identities (.staging excluded)."""
    entries = []
    for where in (folder, folder / READY):
        try:
            with os.scandir(where) as scan:
                for entry in scan:
                    if entry.name != STAGING:
                        stat = entry.stat(follow_symlinks=False)
                        entries.append((where.name, entry.name, stat.st_ino, stat.st_mtime_ns, stat.st_size))
        except FileNotFoundError:
            continue
    return tuple(sorted(entries))


def read_consistently(folder: str | Path, read: Callable[[Path], T], attempts: int = 50) -> T:
    """read(path) on one save's files of `folder`, without modifying it.

    With no committed save in progress, path is the folder. While one is (OUT/.ready exists), path is a temporary
    folder of links that takes each file from .ready if it is still there, else from OUT: the committed save as
    a whole. If the folder changed while reading (a save committed or moved files), the read is repeated.
    """
    folder = Path(folder)
    error: Exception | None = None
    for attempt in range(attempts):
        before = _folder_state(folder)
        try:
            if (folder / READY).is_dir():
                with tempfile.TemporaryDirectory(prefix=".pelab-read-") as view:
                    for path in [*folder.iterdir(), *(folder / READY).iterdir()]:
                        if path.name not in (READY, STAGING):
                            link = Path(view) / path.name
                            link.unlink(missing_ok=True)
                            link.symlink_to(path.resolve())
                    result = read(Path(view))
            else:
                result = read(folder)
        except (OSError, CheckpointError, SafetensorError, ValueError) as caught:
            if _folder_state(folder) == before:
                raise
            error = caught
        else:
            if _folder_state(folder) == before:
                return result
        time.sleep(min(0.001 * 2 ** attempt, 0.05))
    raise CheckpointError(f"{folder}: it kept changing while being read ({attempts} attempts; last error: {error}); "
                          "is something saving to it in a tight loop?")


def model_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's tensors to save: the unwrapped names, the tied LM head stored once (as the embedding)."""
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state


def torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def save_checkpoint(
    folder: str | Path,
    model: Transformer,
    tokenizer: Any = None,
    trainer_state: dict | None = None,
    training_state: dict | None = None,
) -> None:
    # Tensors are serialised in memory and written by Python's file objects, so a full disk is an OSError
    # (torch.save's C++ writer reports it as assorted RuntimeErrors).
    writers: dict[str, Callable[[Path], None]] = {
        WEIGHTS: lambda path: path.write_bytes(save_safetensors(model_state_dict(model), metadata={"format": "pt"})),
        CONFIG: lambda path: model.config.save(path),
    }
    if trainer_state is not None:
        writers[TRAINER_STATE] = lambda path: path.write_text(json.dumps(trainer_state, indent=2) + "\n")
    if training_state is not None:
        writers[TRAINING_STATE] = lambda path: path.write_bytes(torch_bytes(training_state))
    if tokenizer is not None:
        writers[""] = lambda path: tokenizer.save_pretrained(str(path))
    write_atomically(folder, writers)


def has_checkpoint(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / WEIGHTS).exists() or (folder / READY).is_dir()


def _read_weights(folder: Path, shown: Path) -> dict[str, torch.Tensor]:
    if not (folder / WEIGHTS).exists():
        raise CheckpointError(f"{shown}: missing {WEIGHTS}; this is not a complete checkpoint folder")
    try:
        return load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{shown / WEIGHTS}: unreadable or truncated safetensors file ({error})") from error


def load_state_into(model: Transformer, state: dict[str, torch.Tensor], source: str, config_source: str) -> Transformer:
    """Load `state` (our names, tied head stored once) into `model`, checking every name and shape."""
    expected = model_state_dict(model)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: weights do not match {config_source} (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{source}: {name} has shape {tuple(tensor.shape)} but {config_source} implies "
                f"{tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, strict=not model.config.tie_word_embeddings)
    return model


def load_weights_into(model: Transformer, folder: str | Path, config_source: str = "the model config") -> Transformer:
    """Load folder/model.safetensors into `model`, checking every name and shape against its config."""
    folder = _existing(folder)
    state = read_consistently(folder, lambda path: _read_weights(path, folder))
    return load_state_into(model, state, f"{folder / WEIGHTS}", config_source)


def _read_config(folder: Path, shown: Path) -> ModelConfig:
    if not (folder / CONFIG).exists():
        raise CheckpointError(f"{shown}: missing {CONFIG}; this is not a complete checkpoint folder")
    return ModelConfig.load(folder / CONFIG)


def _existing(folder: str | Path) -> Path:
    folder = Path(folder)
    if not folder.is_dir():
        near = nearby_folder(folder, lambda path: (path / CONFIG).exists())
        raise CheckpointError(f"{folder}: no such checkpoint folder" + (f"; did you mean {near}?" if near else ""))
    return folder


def load_config(folder: str | Path) -> ModelConfig:
    folder = _existing(folder)
    return read_consistently(folder, lambda path: _read_config(path, folder))


def load_model(folder: str | Path, device: str | torch.device = "cpu", runtime: RuntimeConfig | None = None) -> Transformer:
    """Build the model from config.json and load model.safetensors (read together, from one save), checking that
    the two agree; `runtime`: how it computes (Transformer), None: the defaults."""
    folder = _existing(folder)

    config, state = read_consistently(folder, lambda path: (_read_config(path, folder), _read_weights(path, folder)))
    return load_state_into(Transformer(config, runtime), state, f"{folder / WEIGHTS}", CONFIG).to(device)


def load_trainer_state(folder: str | Path) -> dict:
    def read(path: Path) -> dict:
        if not (path / TRAINER_STATE).exists():
            raise CheckpointError(f"{Path(folder) / TRAINER_STATE} not found: this checkpoint holds no training "
                                  "state to resume from")
        return json.loads((path / TRAINER_STATE).read_text())

    return read_consistently(folder, read)


def load_training_state(folder: str | Path) -> dict:
    def read(path: Path) -> dict:
        if not (path / TRAINING_STATE).exists():
            raise CheckpointError(f"{Path(folder) / TRAINING_STATE} not found: this checkpoint holds no optimizer "
                                  "state to resume from")
        return torch.load(path / TRAINING_STATE, map_location="cpu", weights_only=True)

    return read_consistently(folder, read)


def weights_digest(folder: str | Path) -> str:
    """What the checkpoint's weights are: the SHA-256 of its model.safetensors, first 16 hex digits."""
    with open(_existing(folder) / WEIGHTS, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()[:16]


def trained_length(folder: str | Path) -> int:
    """The context length the checkpoint was last trained at: the one accessor for this fact.

    Recorded by every trainer as trainer_state["trained_seq_len"] (after context extension, the extended
    length); a checkpoint without a trainer state (written before this was recorded) was trained at its
    max_seq_len. The length a RoPE scaling refers to is ModelConfig.original_length."""
    try:
        state = load_trainer_state(folder)
    except CheckpointError:
        state = {}
    return int(state["trained_seq_len"]) if "trained_seq_len" in state else load_config(folder).max_seq_len


# Where a checkpoint's training data folder is, from any working directory.
# A training run names its data folder as given (`data.dir`, often relative to the directory it was started from).
# Each save also records the folder as an absolute path and as a path relative to the checkpoint folder
# (trainer_state["data_folder"]), so an evaluation started elsewhere, or a run folder moved together with its data,
# still finds it. `training_data_dir` is the one reader: every command that defaults to a checkpoint's own data
# calls it.
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
