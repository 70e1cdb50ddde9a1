"""Normalisation and feed-forward layers of the decoder block: Llama's, and Gemma's variants of them."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model import compiled as compiling
from model.compiled import Compiled


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """RMSNorm.forward's arithmetic (its docstring), on its own so that a long forward can run it compiled."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    if offset:
        return (normed * (offset + weight.float())).to(x.dtype)
    return weight * normed.to(x.dtype)


# Long norms without gradients (evaluation) run compiled: one pass over x instead of the eager path's five (the float32
# copy, the square, the mean, the scaling, the copy back), about 8-16x faster on (16k, 640) or (4, 16k, 256) bfloat16
# on one core. Whether they may is the model's runtime.compiled_pointwise, set on each norm (and feed-forward) when
# the model is built.
_COMPILED_NORM = Compiled(rms_norm, "RMSNorm", "norms run eagerly (model/layers.py)", dynamic=True)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32 (as transformers' LlamaRMSNorm), scaled by a learned gain.

    offset 0 (Llama): the gain is the weight, applied after the cast back to the input's dtype. offset 1 (Gemma's
    convention, transformers' Gemma3RMSNorm): the gain is 1 + weight (a weight of zeros is the identity), applied in
    float32 before the cast. In float32 the two orders agree; in a lower dtype each matches its own reference."""

    compiled = True  # runtime.compiled_pointwise, set by the model that builds the norm (Transformer)

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = _COMPILED_NORM(x, self.weight, self.eps, self.offset) if compiling.worth_compiling(x, self.compiled) else None
        return fast if fast is not None else rms_norm(x, self.weight, self.eps, self.offset)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}" + (f", offset={self.offset}" if self.offset else "")


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' gelu_pytorch_tanh, Gemma's activation)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}  # model.ffn_activation's names (model/config.py)


def _gated(activation):
    def gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return activation(gate) * up
    return gated


# act(gate) * up of a long forward without gradients, compiled: one pass instead of two, with the product taken
# before rounding to the inputs' dtype (the eager path rounds act(gate) first).
_COMPILED_GATED = {name: Compiled(_gated(activation), f"the feed-forward's {name}",
                                  "it runs eagerly (model/layers.py)", dynamic=True)
                   for name, activation in ACTIVATIONS.items()}


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """x as autocast hands it to a matmul (its dtype where autocast is on for x's device and x is a float type it
    casts), cast once for the several projections that read it: each would otherwise cast it again."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(torch.get_autocast_dtype(device))
    return x


class GatedFFN(nn.Module):
    """down(act(gate(x)) * up(x)), bias-free, with transformers' parameter names: SwiGLU with act = silu (Llama),
    GeGLU with act = gelu_tanh (Gemma)."""

    compiled = True  # runtime.compiled_pointwise, set by the model that builds it (Transformer)

    def __init__(self, dim: int, hidden_dim: int, activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)
        self.activation, self.activation_name = ACTIVATIONS[activation], activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = autocast_input(x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = (_COMPILED_GATED[self.activation_name](gate, up) if compiling.worth_compiling(gate, self.compiled)
                  else None)
        return self.down_proj(hidden if hidden is not None else self.activation(gate) * up)
