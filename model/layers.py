"""Normalisation and feed-forward layers of the decoder block: Llama's, and Gemma's variants of them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as transformers' LlamaRMSNorm), scaled by a learned gain.

    offset 0 (Llama): the gain is the weight, applied after the cast back to the input's dtype. offset 1 (Gemma's
    convention, transformers' Gemma3RMSNorm): the gain is 1 + weight (a weight of zeros is the identity), applied in
    float32 before the cast. In float32 the two orders agree; in a lower dtype each matches its own reference."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.offset:
            return (normed * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}" + (f", offset={self.offset}" if self.offset else "")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' gelu_pytorch_tanh, Gemma's activation)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}  # model.ffn_activation's names (model/config.py)


class GatedFFN(nn.Module):
    """down(act(gate(x)) * up(x)), bias-free, with transformers' parameter names: SwiGLU with act = silu (Llama),
    GeGLU with act = gelu_tanh (Gemma)."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
