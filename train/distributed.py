"""Data-parallel training with PyTorch's own stack: torchrun sets the environment, DDP averages gradients.

    torchrun --nproc_per_node 2 -m train.pretrain --config configs/tiny.toml      # gloo on CPU, nccl on CUDA

train.batch_size stays the global micro-batch: every rank draws the same global batch (a function of seed and
step) and trains on its own contiguous 1/N of the rows, so N processes follow the single-process run (equal
up to the order of floating-point sums). Rank 0 alone evaluates, logs and saves. Without torchrun
(WORLD_SIZE unset or 1) every method here is a no-op.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from errors import ConfigError


class Distributed:
    def __init__(self) -> None:
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(self, device: torch.device, batch_size: int) -> torch.device:
        """Join the process group (nccl on CUDA, gloo otherwise); returns this rank's device."""
        if not self.enabled:
            return device
        if batch_size % self.world_size:
            raise ConfigError(
                f"train.batch_size ({batch_size}) is the global micro-batch and must divide evenly over "
                f"{self.world_size} processes; use a multiple of {self.world_size}"
            )
        if device.type == "cuda":
            if self.local_rank >= torch.cuda.device_count():
                raise ConfigError(
                    f"torchrun started process {self.local_rank} of this node, but this machine has "
                    f"{torch.cuda.device_count()} GPU(s) and nccl needs one GPU per process; use "
                    f"--nproc_per_node={torch.cuda.device_count()}, or --train.device=cpu for gloo on the CPU"
                )
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return device

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if not self.enabled:
            return model
        # Buffers (RoPE frequencies, bias tables) are derived from the config: identical on every rank.
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       broadcast_buffers=False)

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous rows of a global batch."""
        if not self.enabled:
            return batch
        rows = batch.shape[0] // self.world_size
        return batch[self.rank * rows : (self.rank + 1) * rows]

    def no_sync(self, model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce on micro-steps before the last of an optimizer step."""
        if not self.enabled or sync:
            return contextlib.nullcontext()
        return model.no_sync()

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean of `tensor` over ranks (the same value everywhere)."""
        if not self.enabled:
            return tensor
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor / self.world_size

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self, wait: bool = True) -> None:
        """Leave the process group; `wait` first lets every rank finish (not after an error on this one)."""
        if self.enabled and dist.is_initialized():
            if wait:
                dist.barrier()
            dist.destroy_process_group()
