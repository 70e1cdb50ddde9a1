"""Training windows from packed token files (memory-mapped, never loaded whole)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from commands import nearby_folder
from errors import DataError

# Targets equal to IGNORE_INDEX add no loss (PyTorch cross_entropy's default ignore_index): SFT labels, padding.
IGNORE_INDEX = -100


class TokenFile:
    """A memory-mapped train.bin / val.bin written by data.prepare."""

    def __init__(self, path: str | Path, dtype: str = "uint16", expected_tokens: int | None = None,
                 vocab_size: int | None = None) -> None:
        """Open and check: a whole number of `dtype` tokens, as many as meta.json says (when given), every id below
        `vocab_size` (when given; one chunked pass over the memory map)."""
        self.path = Path(path)
        if not self.path.exists():
            raise DataError(f"{self.path} not found; create it with `python -m data.prepare --out {self.path.parent}`")
        size = self.path.stat().st_size
        if size == 0:
            raise DataError(f"{self.path} is empty; re-run data.prepare on a source with text")
        itemsize = np.dtype(dtype).itemsize
        redo = f"re-run `python -m data.prepare` into {self.path.parent}"
        if size % itemsize:
            raise DataError(f"{self.path} is {size:,} bytes, not a whole number of {dtype} tokens ({itemsize} bytes "
                            f"each): it was cut short or written with another dtype; {redo}")
        if expected_tokens is not None and size // itemsize != expected_tokens:
            other = [name for name in ("uint16", "uint32") if name != dtype and size == expected_tokens *
                     np.dtype(name).itemsize]
            why = (f"it holds {other[0]} tokens but meta.json says {dtype}" if other else
                   "it was cut short, or meta.json belongs to another preparation")
            raise DataError(f"{self.path} holds {size // itemsize:,} {dtype} tokens, meta.json says "
                            f"{expected_tokens:,}: {why}; {redo}")
        self.tokens = np.memmap(self.path, dtype=np.dtype(dtype), mode="r")
        if vocab_size is not None:
            largest = max(int(self.tokens[start : start + 2**22].max()) for start in range(0, len(self.tokens), 2**22))
            if largest >= vocab_size:
                raise DataError(f"{self.path} holds token id {largest}, but the vocabulary has {vocab_size} ids "
                                f"(meta.json vocab_size): the file was written with another tokenizer; {redo}")


    def __len__(self) -> int:
        return len(self.tokens)

    def windows(self, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (len(starts), seq_len) int64, for windows starting at `starts`."""
        return windows_at(self.tokens, starts, seq_len)


def open_split(data_dir: str | Path, split: str, meta: dict | None = None) -> TokenFile:
    """DATA_DIR/SPLIT.bin ("train" or "val"), checked against its meta.json (dtype, token count, vocabulary)."""
    meta = meta if meta is not None else read_meta(data_dir)
    expected = meta.get(f"{split}_tokens")
    return TokenFile(Path(data_dir) / f"{split}.bin", meta["dtype"], int(expected) if expected is not None else None,
                     int(meta["vocab_size"]) if "vocab_size" in meta else None)

def windows_at(tokens: np.ndarray, starts, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (len(starts), seq_len) int64: the windows tokens[start : start + seq_len
    + 1] (the one place token windows are cut: training batches and the perplexity evaluation)."""
    rows = torch.from_numpy(np.stack([np.asarray(tokens[start : start + seq_len + 1], dtype=np.int64)
                                      for start in starts]))
    return rows[:, :-1], rows[:, 1:]


def read_meta(data_dir: str | Path) -> dict:
    path = Path(data_dir) / "meta.json"
    if not path.exists():
        near = nearby_folder(data_dir, lambda folder: (folder / "meta.json").exists())
        fix = f"did you mean {near}?" if near else \
            f"create it with `python -m data.prepare --data stdlib --out {data_dir}`"
        raise DataError(f"{path} not found: {data_dir} is not a prepared data folder; {fix}")
    return json.loads(path.read_text())


class PretrainBatches:
    """Random windows for training (a function of seed and step, so a resumed run sees the same data)
    and fixed, evenly spaced windows for validation."""

    def __init__(self, data_dir: str | Path, seq_len: int, batch_size: int, seed: int, val_batches: int) -> None:
        meta = read_meta(data_dir)
        self.data_dir = Path(data_dir)  # recorded with each checkpoint (model/checkpoint.py)
        self.train = open_split(data_dir, "train", meta)
        self.val = open_split(data_dir, "val", meta)
        for split in (self.train, self.val):
            if len(split) <= seq_len + 1:
                raise DataError(f"{split.path} holds {len(split)} tokens, fewer than one window of {seq_len + 1}")
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.val_batches = val_batches
        self.vocab_size = int(meta["vocab_size"])

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = np.random.default_rng([self.seed, step, micro_step])
        starts = generator.integers(0, len(self.train) - self.seq_len - 1, size=self.batch_size)
        return self.train.windows(starts, self.seq_len)

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        count = self.val_batches * self.batch_size
        last_start = len(self.val) - self.seq_len - 1
        starts = np.linspace(0, last_start, num=min(count, last_start + 1)).astype(np.int64)
        for first in range(0, len(starts), self.batch_size):
            yield self.val.windows(starts[first : first + self.batch_size], self.seq_len)


def pose_positions_and_spans(rng: np.random.Generator, window: int, target: int) -> tuple[np.ndarray, int, int, int]:
    """One PoSE row (Zhu et al., ICLR 2024; dwzhu-pku/PoSE, two chunks): the first chunk is tokens [0, cut) of a
    text span at positions [0, cut); the second is `window - cut` tokens taken further on in the span (a content skip,
    as the reference's lt2..rt2) at positions starting at cut + skip, skip ~ U{0 .. target - window}, so positions
    stay below `target` while the window keeps its original length.

    Returns (positions (window,), cut, the second chunk's start in the span, the span length needed)."""
    cut = int(rng.integers(1, (window + 1) // 2 + 1))  # the reference's rt1 ~ U{1 .. (window + 1) // 2}
    skip = int(rng.integers(0, target - window + 1))
    span = target + 1
    end = int(rng.integers(window, span + 1))  # the reference's rt2 ~ U{window .. span}
    second = end - (window - cut)
    positions = np.arange(window, dtype=np.int64)
    positions[cut:] += skip
    return positions, cut, second, span


class PoseBatches(PretrainBatches):
    """PoSE training batches: windows of the original length whose position ids cover the target length
    (pose_positions_and_spans). A batch is (inputs, targets, positions); every target is its input's own next token
    in the text (the reference's labels are the row shifted, so the first chunk's last token there predicts the
    first token after the skip). Validation windows are plain windows of the target length, so the validation loss
    measures the length the run extends to."""

    def __init__(self, data_dir: str | Path, window: int, target: int, batch_size: int, seed: int,
                 val_batches: int) -> None:
        if not 2 <= window < target:
            raise DataError(f"PoSE needs 2 <= the training window ({window}) < the target length ({target})")
        super().__init__(data_dir, target, batch_size, seed, val_batches)
        self.window = window
        self.target = target

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        generator = np.random.default_rng([self.seed, step, micro_step])
        rows, targets, positions = [], [], []
        for _ in range(self.batch_size):
            row_positions, cut, second, span = pose_positions_and_spans(generator, self.window, self.target)
            start = int(generator.integers(0, len(self.train) - span - 1))
            text = np.asarray(self.train.tokens[start : start + span + 1], dtype=np.int64)
            first_chunk = text[: cut + 1]  # inputs 0..cut-1 and their next tokens
            second_chunk = text[second : second + self.window - cut + 1]
            inputs = np.concatenate([first_chunk[:-1], second_chunk[:-1]])
            next_tokens = np.concatenate([first_chunk[1:], second_chunk[1:]])  # each token's own next token
            rows.append(inputs)
            targets.append(next_tokens)
            positions.append(row_positions)
        return (torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(targets)),
                torch.from_numpy(np.stack(positions)))
