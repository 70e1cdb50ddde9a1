"""Training windows from packed token files (memory-mapped, never loaded whole)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from errors import DataError

# Targets equal to IGNORE_INDEX add no loss (PyTorch cross_entropy's default ignore_index): SFT labels, padding.
IGNORE_INDEX = -100


class TokenFile:
    """A memory-mapped train.bin / val.bin written by data.prepare."""

    def __init__(self, path: str | Path, dtype: str = "uint16") -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise DataError(f"{self.path} not found; create it with `python -m data.prepare --out {self.path.parent}`")
        if self.path.stat().st_size == 0:
            raise DataError(f"{self.path} is empty; re-run data.prepare on a source with text")
        self.tokens = np.memmap(self.path, dtype=np.dtype(dtype), mode="r")

    def __len__(self) -> int:
        return len(self.tokens)

    def windows(self, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (len(starts), seq_len) int64, for windows starting at `starts`."""
        return windows_at(self.tokens, starts, seq_len)


def windows_at(tokens: np.ndarray, starts, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets, each (len(starts), seq_len) int64: the windows tokens[start : start + seq_len
    + 1] (the one place token windows are cut: training batches and the perplexity evaluation)."""
    rows = torch.from_numpy(np.stack([np.asarray(tokens[start : start + seq_len + 1], dtype=np.int64)
                                      for start in starts]))
    return rows[:, :-1], rows[:, 1:]


def read_meta(data_dir: str | Path) -> dict:
    path = Path(data_dir) / "meta.json"
    if not path.exists():
        raise DataError(
            f"{path} not found: {data_dir} is not a prepared data folder; "
            f"create it with `python -m data.prepare --data stdlib --out {data_dir}`"
        )
    return json.loads(path.read_text())


class PretrainBatches:
    """Random windows for training (a function of seed and step, so a resumed run sees the same data)
    and fixed, evenly spaced windows for validation."""

    def __init__(self, data_dir: str | Path, seq_len: int, batch_size: int, seed: int, val_batches: int) -> None:
        meta = read_meta(data_dir)
        self.train = TokenFile(Path(data_dir) / "train.bin", meta["dtype"])
        self.val = TokenFile(Path(data_dir) / "val.bin", meta["dtype"])
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
