"""Position encodings as plug-ins. The attention code calls these hooks and never branches on a name.

Hooks (each has a do-nothing default):
  embed(x, positions)                       absolute encodings add to the token embeddings
  prepare(q_positions, k_positions)         per-forward state shared by all layers (e.g. RoPE's cos/sin)
  rotate_queries(q, state), rotate_keys(k, state)
                                            rotary encodings; keys are rotated before caching, or, when
                                            `caches_rotated_keys` is False (dynamic NTK), all cached raw keys
                                            are rotated again at every step
  score_bias(q, state, layer, rows)         additive logit bias (batch|1, heads, len(rows), k_time)
  value_term(probs, state, layer, rows)     a term added to the attention output (Shaw's relative values)

Capabilities the attention reads: `has_score_bias`, `has_value_term`, `caches_rotated_keys`.
New encodings register with `@register("name")`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from errors import ConfigError, PositionRangeError
from model.rope import LENGTH_DEPENDENT_SCALINGS, ROPE_SCALINGS, apply_rope, rope_cos_sin

if TYPE_CHECKING:
    from model.config import ModelConfig

POSITION_ENCODINGS: dict[str, type["PositionEncoding"]] = {}


def register(name: str) -> Callable[[type["PositionEncoding"]], type["PositionEncoding"]]:
    def decorator(cls: type["PositionEncoding"]) -> type["PositionEncoding"]:
        POSITION_ENCODINGS[name] = cls
        return cls

    return decorator


@dataclass
class Positions:
    """Query positions (batch|1, q_time) and the positions of all keys attended to (batch|1, k_time)."""

    queries: torch.Tensor
    keys: torch.Tensor

    def relative(self, rows: slice) -> torch.Tensor:
        """key position - query position, (batch|1, len(rows), k_time)."""
        return self.keys[:, None, :] - self.queries[:, rows, None]


class PositionEncoding(nn.Module):
    """Base class: no position information at all."""

    has_score_bias = False
    has_value_term = False
    caches_rotated_keys = True
    # AdamW settings for this encoding's own parameters, if it has any (train/loop.py: position_group_settings):
    # "lr_scale" multiplies train.lr, "weight_decay" replaces train.weight_decay. Chosen by measurement (README).
    optimizer_defaults: dict[str, float] = {}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__()
        self.config = config

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:
        """Raise ConfigError for settings this encoding cannot work with."""

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def token_embedding_std(self) -> float | None:
        """The initial std of the token embeddings this encoding expects (None: model.init_std)."""
        return None

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> Any:
        return Positions(q_positions, k_positions)

    def rotate_queries(self, q: torch.Tensor, state: Any) -> torch.Tensor:
        return q

    def rotate_keys(self, k: torch.Tensor, state: Any) -> torch.Tensor:
        return k

    def score_bias(self, q: torch.Tensor, state: Any, layer: int, rows: slice) -> torch.Tensor | None:
        return None

    def value_term(self, probs: torch.Tensor, state: Any, layer: int, rows: slice) -> torch.Tensor | None:
        return None


@register("none")
class NoPE(PositionEncoding):
    """No position encoding (NoPE): only the causal mask tells tokens apart by order."""


@dataclass
class RopeState:
    q_cos: torch.Tensor  # (batch|1, 1, q_time, head_dim)
    q_sin: torch.Tensor
    k_cos: torch.Tensor  # (batch|1, 1, k_time, head_dim): all keys (dynamic) or the new keys (static)
    k_sin: torch.Tensor


@register("rope")
class RoPE(PositionEncoding):
    """Rotary embedding (Su et al. 2021) with an optional scaling from model.rope.ROPE_SCALINGS.

    transformers' convention: cos and sin are multiplied by the attention factor, so q and k are each
    scaled by it and the logits by its square (YaRN's sqrt(1/t) on q and k). It is applied once, here.
    """

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.scaling = config.rope_scaling or {"rope_type": "default"}
        self.scaling_name = self.scaling["rope_type"]
        self.init_fn = ROPE_SCALINGS[self.scaling_name]
        # Dynamic NTK changes the base with the length, so keys are cached raw and rotated at every step.
        self.caches_rotated_keys = self.scaling_name not in LENGTH_DEPENDENT_SCALINGS
        inv_freq, attention_factor = self.init_fn(config.head_dim, config.rope_theta, self.scaling, None)
        # Derived from the config, so not saved with the weights (rebuilt on load).
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.head_dim % 2:
            raise ConfigError(f"rope needs an even head_dim, got {config.head_dim} (dim / n_heads)")

    def frequencies(self, k_positions: torch.Tensor) -> tuple[torch.Tensor, float]:
        if self.caches_rotated_keys:
            return self.inv_freq, self.attention_factor
        seq_len = int(k_positions.max()) + 1
        inv_freq, attention_factor = self.init_fn(self.config.head_dim, self.config.rope_theta, self.scaling, seq_len)
        return inv_freq.to(k_positions.device), attention_factor

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> RopeState:
        inv_freq, attention_factor = self.frequencies(k_positions)
        layout = self.config.rope_layout
        q_cos, q_sin = rope_cos_sin(inv_freq, q_positions, layout, attention_factor)
        q_cos, q_sin = q_cos[:, None], q_sin[:, None]
        if self.caches_rotated_keys or k_positions is q_positions:
            return RopeState(q_cos, q_sin, q_cos, q_sin)
        k_cos, k_sin = rope_cos_sin(inv_freq, k_positions, layout, attention_factor)
        return RopeState(q_cos, q_sin, k_cos[:, None], k_sin[:, None])

    def rotate_queries(self, q: torch.Tensor, state: RopeState) -> torch.Tensor:
        return apply_rope(q, state.q_cos, state.q_sin, self.config.rope_layout)

    def rotate_keys(self, k: torch.Tensor, state: RopeState) -> torch.Tensor:
        return apply_rope(k, state.k_cos, state.k_sin, self.config.rope_layout)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes of the ALiBi reference code: a geometric sequence from 2^(-8/n) for a power of two n;
    otherwise the slopes for the nearest lower power of two c, then every other slope of 2c."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two_slopes(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra)


@register("alibi")
class ALiBi(PositionEncoding):
    """Attention with linear biases (Press et al. 2022): logit bias -m_h * (i - j) for key j <= query i."""

    has_score_bias = True

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice) -> torch.Tensor:
        distance = state.relative(rows).to(torch.float32)  # j - i <= 0 where attended
        return self.slopes[None, :, None, None] * distance[:, None]


def t5_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Decoder (unidirectional) bucket of `relative_position` = key - query, as in transformers' T5Attention."""
    distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    scaled = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return torch.where(is_small, distance, large)


@register("t5")
class T5Bias(PositionEncoding):
    """T5's learned relative bias: log-spaced distance buckets, one scalar per (bucket, head), shared by layers."""

    has_score_bias = True
    # Measured (README, "Learned position parameters"): at train.lr Adam moves a bias by about one nat over the whole
    # schedule; 10x without weight decay lowers the full preset's validation loss by 0.26 nats (30x: by 0.23).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.t5_num_buckets, config.n_heads)

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.t5_num_buckets < 2 or config.t5_max_distance <= config.t5_num_buckets // 2:
            raise ConfigError("t5 needs model.t5_num_buckets >= 2 and model.t5_max_distance > t5_num_buckets / 2")

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice) -> torch.Tensor:
        buckets = t5_bucket(state.relative(rows), self.config.t5_num_buckets, self.config.t5_max_distance)
        return self.relative_attention_bias(buckets).permute(0, 3, 1, 2).float()  # (batch|1, heads, rows, keys)


@register("shaw")
class ShawRelative(PositionEncoding):
    """Shaw et al. 2018: learned key and value vectors for the clipped distance clip(j - i, -k, k), per layer,
    shared across heads. e_ij = q_i . (k_j + a^K_ij) / sqrt(d);  z_i = sum_j a_ij (v_j + a^V_ij)."""

    has_score_bias = True
    has_value_term = True
    # Measured (README): 10x without weight decay is 0.018 nats better than train.lr with decay (within noise).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        size = 2 * config.shaw_max_distance + 1
        self.relative_keys = nn.ModuleList(nn.Embedding(size, config.head_dim) for _ in range(config.n_layers))
        self.relative_values = nn.ModuleList(nn.Embedding(size, config.head_dim) for _ in range(config.n_layers))

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.shaw_max_distance < 1:
            raise ConfigError(f"shaw needs model.shaw_max_distance >= 1, got {config.shaw_max_distance}")

    def index(self, state: Positions, rows: slice) -> torch.Tensor:
        k = self.config.shaw_max_distance
        return state.relative(rows).clamp(-k, k) + k  # (batch|1, rows, keys)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice) -> torch.Tensor:
        batch, heads, time, _ = q.shape
        per_distance = q @ self.relative_keys[layer].weight.to(q.dtype).T  # (batch, heads, rows, 2k+1)
        index = self.index(state, rows)[:, None].expand(batch, heads, time, -1)
        return torch.gather(per_distance, -1, index).float() / math.sqrt(self.config.head_dim)

    def value_term(self, probs: torch.Tensor, state: Positions, layer: int, rows: slice) -> torch.Tensor:
        batch, heads, time, _ = probs.shape
        index = self.index(state, rows)[:, None].expand(batch, heads, time, -1)
        size = 2 * self.config.shaw_max_distance + 1
        weight_per_distance = probs.new_zeros(batch, heads, time, size).scatter_add_(-1, index, probs)
        return weight_per_distance @ self.relative_values[layer].weight.to(probs.dtype)


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...), in float32."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


# model.sinusoidal_embedding -> (scale the token embeddings by sqrt(dim)?, their initial std; None = init_std).
SINUSOIDAL_RECIPES: dict[str, tuple[bool, str | None]] = {
    "fairseq": (True, "dim^-0.5"),  # Vaswani et al. 2017 and fairseq's TransformerLM (ALiBi paper's baseline)
    "unscaled": (False, None),  # GPT-2 / transformers style: sum as they are
    "legacy": (True, None),  # sqrt(dim) scale with std init_std: the sinusoid carries ~80% of the input energy
}


@register("sinusoidal")
class Sinusoidal(PositionEncoding):
    """Fixed absolute sinusoids added to the token embeddings. model.sinusoidal_embedding picks how the token
    embeddings are scaled and initialised against them (default "fairseq": x sqrt(d), std d^-0.5)."""

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.dim % 2:
            raise ConfigError(f"sinusoidal needs an even model.dim, got {config.dim}")

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        scaled, _ = SINUSOIDAL_RECIPES[self.config.sinusoidal_embedding]
        if scaled:
            x = x * math.sqrt(self.config.dim)
        return x + sinusoid(positions, self.config.dim).to(x.dtype)

    def token_embedding_std(self) -> float | None:
        _, std = SINUSOIDAL_RECIPES[self.config.sinusoidal_embedding]
        return self.config.dim**-0.5 if std == "dim^-0.5" else None


@register("learned")
class LearnedAbsolute(PositionEncoding):
    """A learned table of absolute position embeddings (GPT-2). It has no rows past its size: such positions
    are an error unless model.learned_clamp is set, which reuses the last row."""

    # Measured (README): weight decay changes nothing (0.0015 nats); 10x the learning rate is 0.48 nats worse.
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.size = config.learned_max_positions or config.max_seq_len
        self.table = nn.Embedding(self.size, config.dim)

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.learned_max_positions and config.learned_max_positions < config.max_seq_len:
            raise ConfigError(
                f"model.max_seq_len ({config.max_seq_len}) is beyond the learned table of "
                f"{config.learned_max_positions} positions (model.learned_max_positions); raise the table size"
            )

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.config.learned_clamp:
            positions = positions.clamp(max=self.size - 1)
        elif int(positions.max()) >= self.size:
            raise PositionRangeError(
                f"position {int(positions.max())} is beyond the learned table of {self.size} positions "
                f"(model.learned_max_positions); evaluate at <= {self.size} tokens, or set "
                "model.learned_clamp=true to reuse the last row for later positions"
            )
        return x + self.table(positions)


def build_position_encoding(config: "ModelConfig") -> PositionEncoding:
    return POSITION_ENCODINGS[config.position](config)
