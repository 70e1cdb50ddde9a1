"""The position encodings, registered by name (the interface and its hooks: model/position_base.py).

Here: none, alibi, t5, shaw, sinusoidal, learned. Rotary encodings (rope with partial rotary and p-RoPE, xpos) are
in model/position_rotary.py, the functional relative biases (kerple, fire) in model/position_bias.py, and the
contextual one (cope) in model/position_contextual.py. Importing this module registers them all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from errors import ConfigError, PositionRangeError
from model.position_base import ALL, POSITION_ENCODINGS, PositionEncoding, Positions, register

if TYPE_CHECKING:
    from model.config import ModelConfig

__all__ = ["POSITION_ENCODINGS", "PositionEncoding", "Positions", "register", "build_position_encoding"]


@register("none")
class NoPE(PositionEncoding):
    """No position encoding (NoPE): only the causal mask tells tokens apart by order."""

    encodes_positions = False


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
    exact_buffers = ("slopes",)

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        distance = state.relative(rows, keys).to(torch.float32)  # j - i <= 0 where attended
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


SHARED_BIAS_ELEMENTS = 2**22  # at most this many bias elements are kept for the other layers of one forward


@dataclass
class SharedBiasPositions(Positions):
    """Positions, and the biases already built in this forward for an encoding whose bias every layer shares
    (T5): the next layers reuse them instead of gathering (and back-propagating through) the same table again.
    Bounded: past SHARED_BIAS_ELEMENTS (a long evaluation in many chunks) each layer builds its own."""

    biases: dict = field(default_factory=dict)
    kept: int = 0

    def shared(self, rows: slice, keys: slice, build) -> torch.Tensor:  # noqa: ANN001 (a zero-argument callable)
        key = (rows.start, rows.stop, keys.start, keys.stop)
        if key in self.biases:
            return self.biases[key]
        bias = build()
        if self.kept + bias.numel() <= SHARED_BIAS_ELEMENTS:
            self.biases[key] = bias
            self.kept += bias.numel()
        return bias


@register("t5")
class T5Bias(PositionEncoding):
    """T5's learned relative bias: log-spaced distance buckets, one scalar per (bucket, head), shared by layers."""

    has_score_bias = True
    # Measured (docs/baselines.md, "Learned position parameters"): at train.lr Adam moves a bias by about one nat over the whole
    # schedule; 10x without weight decay lowers the full preset's validation loss by 0.26 nats (30x: by 0.23).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.t5_num_buckets, config.n_heads)

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.t5_num_buckets < 2 or config.t5_max_distance <= config.t5_num_buckets // 2:
            raise ConfigError("t5 needs model.t5_num_buckets >= 2 and model.t5_max_distance > t5_num_buckets / 2")

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> Positions:
        return SharedBiasPositions(q_positions, k_positions)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        def build() -> torch.Tensor:  # (batch|1, heads, rows, keys)
            buckets = t5_bucket(state.relative(rows, keys), self.config.t5_num_buckets, self.config.t5_max_distance)
            return self.relative_attention_bias(buckets).permute(0, 3, 1, 2).float()

        return state.shared(rows, keys, build) if isinstance(state, SharedBiasPositions) else build()


@register("shaw")
class ShawRelative(PositionEncoding):
    """Shaw et al. 2018: learned key and value vectors for the clipped distance clip(j - i, -k, k), per layer,
    shared across heads. e_ij = q_i . (k_j + a^K_ij) / sqrt(d);  z_i = sum_j a_ij (v_j + a^V_ij)."""

    has_score_bias = True
    has_value_term = True
    # Measured (docs/baselines.md): 10x without weight decay is 0.018 nats better than train.lr with decay (within noise).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        size = 2 * config.shaw_max_distance + 1
        # One table per layer that uses Shaw, keyed by the layer index ("0", "1", ...: the names a ModuleList gives,
        # so single-encoding checkpoints keep theirs); a hybrid's other layers get none (no unused parameters).
        layers = [str(index) for index in self.layers_using()]
        self.relative_keys = nn.ModuleDict({index: nn.Embedding(size, config.head_dim) for index in layers})
        self.relative_values = nn.ModuleDict({index: nn.Embedding(size, config.head_dim) for index in layers})
        self.clipped_distance = config.shaw_max_distance  # causal: j - i in [-k, 0] only, as d = i - j in [0, k]

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:

        if config.shaw_max_distance < 1:
            raise ConfigError(f"shaw needs model.shaw_max_distance >= 1, got {config.shaw_max_distance}")

    def index(self, state: Positions, rows: slice, keys: slice) -> torch.Tensor:
        k = self.config.shaw_max_distance
        return state.relative(rows, keys).clamp(-k, k) + k  # (batch|1, rows, keys)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        batch, heads, time, _ = q.shape
        per_distance = q @ self.relative_keys[str(layer)].weight.to(q.dtype).T  # (batch, heads, rows, 2k+1)
        index = self.index(state, rows, keys)[:, None].expand(batch, heads, time, -1)
        return torch.gather(per_distance, -1, index).float() / math.sqrt(self.config.head_dim)

    def value_term(self, probs: torch.Tensor, state: Positions, layer: int, rows: slice,
                   keys: slice = ALL) -> torch.Tensor:
        batch, heads, time, _ = probs.shape
        index = self.index(state, rows, keys)[:, None].expand(batch, heads, time, -1)
        size = 2 * self.config.shaw_max_distance + 1
        weight_per_distance = probs.new_zeros(batch, heads, time, size).scatter_add_(-1, index, probs)
        return weight_per_distance @ self.relative_values[str(layer)].weight.to(probs.dtype)

    def clipped_tables(self, q: torch.Tensor, state: Positions, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row k - d of each table is distance d = i - j (clip(j - i, -k, k) + k = k - min(d, k) for j <= i)."""
        k = self.config.shaw_max_distance
        vectors = self.relative_keys[str(layer)].weight[: k + 1].flip(0)
        bias = (q @ vectors.to(q.dtype).T).float() / math.sqrt(self.config.head_dim)
        return bias, self.relative_values[str(layer)].weight[: k + 1].flip(0)


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

    per_layer = False

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

    per_layer = False
    # Measured (docs/baselines.md): weight decay changes nothing (0.0015 nats); 10x the learning rate is 0.48 nats worse.
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
        # Compiled, the range check would break the graph at a data-dependent int(): it is skipped there (a compiled
        # training step never goes past the table, which validate() keeps at least max_seq_len long).
        if self.config.learned_clamp:
            positions = positions.clamp(max=self.size - 1)
        elif not torch.compiler.is_compiling() and int(positions.max()) >= self.size:
            raise PositionRangeError(
                f"position {int(positions.max())} is beyond the learned table of {self.size} positions "
                f"(model.learned_max_positions); evaluate at <= {self.size} tokens, or set "
                "model.learned_clamp=true to reuse the last row for later positions"
            )
        return x + self.table(positions)


# The other modules register theirs on import; importing them here makes this module the one complete registry.
import model.position_bias  # noqa: E402, F401  (registers kerple, fire)
import model.position_contextual  # noqa: E402, F401  (registers cope)
import model.position_rotary  # noqa: E402, F401  (registers rope, xpos)


def build_position_encoding(config: "ModelConfig", name: str | None = None) -> PositionEncoding:
    """The encoding `name` (default model.position) for `config`."""
    return POSITION_ENCODINGS[name or config.position](config)
