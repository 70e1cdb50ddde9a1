"""Device and precision choices shared by training, generation and evaluation."""
from __future__ import annotations

import contextlib

import torch

from errors import ConfigError


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
