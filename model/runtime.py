"""Device and precision choices shared by training, generation and evaluation, and the process's part of the
runtime settings (RuntimeConfig, model/runtime_config.py).

A command calls configure_runtime once, at start-up (a training run and a comparison's job with their run config's
[runtime], the other commands with the defaults): keep_freed_memory is an action on the process (glibc's mallopt,
which cannot be taken back). compiled_rope is the model's: it is passed to the model that computes with it
(Transformer(config, runtime), load_model(..., runtime=...)), which hands it to its encodings; nothing reads it from
this module. Changing either changes how fast, not what, is computed. Which attention backend computes a layer is
the model's setting (model.attention_backend, model/attention/registry.py), not the process's."""
from __future__ import annotations

import contextlib
import ctypes
import platform

import torch

from errors import ConfigError
from model.runtime_config import RETIRED, RuntimeConfig  # noqa: F401 (RETIRED: the switches named here before)


def configure_runtime(config: RuntimeConfig | None = None) -> None:
    """Put the process's part of `config` (the defaults if None) in effect, at a command's start: keep_freed_memory,
    if asked for, acts at once (glibc cannot take it back). The model's part (compiled_rope) is passed to the model."""
    if (config or RuntimeConfig()).keep_freed_memory:
        keep_freed_memory()


def resolve_device(name: str = "auto") -> torch.device:
    """auto picks cuda, then mps, then cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for but CUDA is not available; use --train.device=auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device 'mps' was asked for but MPS is not available; use --train.device=auto or cpu")
    return torch.device(name)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(check()) if check is not None else False
    return False


def autocast_dtype(device: torch.device, dtype: str = "auto") -> torch.dtype | None:
    """The autocast dtype for a precision name, or None for plain float32."""
    if dtype == "float32":
        return None
    if dtype == "bfloat16" or (dtype == "auto" and bf16_supported(device)):
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """bf16 autocast (weights stay float32) or a no-op."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_freed_memory_kept = False


def keep_freed_memory() -> bool:
    """Let this process reuse the memory of freed tensors instead of asking the kernel for fresh pages.

    glibc's malloc serves every allocation above its mmap threshold (at most 32 MiB) with newly mapped pages and
    unmaps them when freed, so each large tensor of every step faults all of its pages in again (the kernel zeroes
    each one). With both thresholds raised, freed blocks stay in the heap and the next step reuses them; the price
    is that the process keeps its high-water mark instead of returning memory between steps. What it gains, for
    training steps and for dynamic NTK's decoding: docs/performance.md ("Dynamic NTK's key rotation and freed
    memory").

    Called by configure_runtime at a command's start, unless runtime.keep_freed_memory = false; acts once per process
    (`_freed_memory_kept` records that glibc's setting was changed, which cannot be undone); glibc only (elsewhere
    nothing changes). Returns whether the setting is in effect."""
    global _freed_memory_kept
    if not _freed_memory_kept and platform.libc_ver()[0] == "glibc":
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        _freed_memory_kept = bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30) and mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    return bool(_freed_memory_kept)
