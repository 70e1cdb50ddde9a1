"""Position encodings as plug-ins. The attention code calls these hooks and never branches on a name.

Hooks (every one has a do-nothing default):
  embed(x, positions)            absolute encodings add to the token embeddings
  prepare(positions)             per-forward state shared by all layers (e.g. RoPE's cos/sin)
  rotate(q, k, state)            rotary encodings turn queries and new keys before the keys are cached
  score_bias(state, ...)         additive attention-logit bias (heads, q_time, k_time), or None

New encodings register themselves in POSITION_ENCODINGS with `@register("name")`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from model.rope import ROPE_SCALINGS, apply_rope, rope_cos_sin

if TYPE_CHECKING:
    from model.config import ModelConfig

POSITION_ENCODINGS: dict[str, type["PositionEncoding"]] = {}


def register(name: str) -> Callable[[type["PositionEncoding"]], type["PositionEncoding"]]:
    def decorator(cls: type["PositionEncoding"]) -> type["PositionEncoding"]:
        POSITION_ENCODINGS[name] = cls
        return cls

    return decorator


class PositionEncoding(nn.Module):
    """Base class: no position information at all."""

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__()
        self.config = config

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:
        """Raise ConfigError for settings this encoding cannot work with."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def prepare(self, positions: torch.Tensor) -> Any:
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, state: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def score_bias(self, state: Any) -> torch.Tensor | None:
        return None


@register("none")
class NoPE(PositionEncoding):
    """No position encoding (NoPE): only the causal mask tells tokens apart by order."""


@register("rope")
class RoPE(PositionEncoding):
    """Rotary embedding (Su et al. 2021): q and k are rotated by position-dependent angles."""

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        inv_freq, attention_factor = ROPE_SCALINGS["default"](config.head_dim, config.rope_theta, None)
        # Derived from the config, so not saved with the weights (rebuilt on load).
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:
        from model.config import ConfigError

        if config.head_dim % 2:
            raise ConfigError(f"rope needs an even head_dim, got {config.head_dim} (dim / n_heads)")

    def prepare(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: (batch or 1, time) -> cos, sin: (batch or 1, 1, time, head_dim)
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.config.rope_layout, self.attention_factor)
        return cos[:, None], sin[:, None]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, state: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = state
        layout = self.config.rope_layout
        return apply_rope(q, cos, sin, layout), apply_rope(k, cos, sin, layout)


def build_position_encoding(config: "ModelConfig") -> PositionEncoding:
    return POSITION_ENCODINGS[config.position](config)
