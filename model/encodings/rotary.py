"""Rotary encodings: rope (with partial rotary and p-RoPE) and xpos.

    rope   Su et al. 2021, with an optional scaling from model.methods.ROPE_SCALINGS (model.rope_scaling).
           Settings (model.position_args.rope): fraction < 1: partial rotary (GPT-NeoX `rotary_pct`, transformers' `partial_rotary_factor`):
           only the first round(fraction * head_dim) dimensions of each head rotate, with frequencies over that
           many dimensions; the rest carry no position.
           p < 1: p-RoPE (Barbero et al., ICLR 2025): the lowest-frequency fraction 1 - p of the
           frequencies is set to zero, so those dimensions carry no position (0-RoPE is NoPE, 1-RoPE is RoPE).
    xpos   Sun et al. 2022: RoPE whose pair i is scaled by zeta_i^(n / gamma) on the query at position n and by
           zeta_i^(-m / gamma) on the key at position m, so a score carries zeta_i^((n - m) / gamma), a decay with
           distance; zeta_i = (2i + 0.4 d) / (1.4 d) and gamma = the `scale_base` setting, as in torchscale's XPOS.
           With p < 1 the pairs that no longer rotate keep their decay (a distance signal, not a rotation).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from errors import ConfigError, PositionRangeError
from model.encodings import EncodingSettings, PositionEncoding, register_encoding
from model.fields import ModelFields
from model.methods import ROPE_SCALINGS
from model.rope import apply_rope, default_inv_freq, rope_cos_sin


@dataclass
class RopeState:
    q_cos: torch.Tensor  # (batch|1, 1, q_time, rotary_dim)
    q_sin: torch.Tensor
    k_cos: torch.Tensor  # (batch|1, 1, k_time, rotary_dim): all keys (dynamic) or the new keys (static)
    k_sin: torch.Tensor


@dataclass
class RopeStates:
    """Per-layer RoPE (model.rope_theta_layers, rope_scaling_layers): each variant's tables, and each layer's
    variant; for_layer hands a layer its own."""

    states: list[RopeState]
    variant_of: dict[int, int]


def rotary_dim(fraction: float, head_dim: int) -> int:
    """The number of dimensions of each head that rotate: int(fraction * head_dim), as GPT-NeoX and transformers
    round it."""
    return int(fraction * head_dim + 1e-9)


@dataclass
class RotarySettings(EncodingSettings):
    # Partial rotary (GPT-NeoX rotary_pct, transformers' partial_rotary_factor): the first fraction of each head
    # rotates, the rest carries no position.
    fraction: float = 1.0
    # p-RoPE (Barbero et al., ICLR 2025): the lowest-frequency fraction 1 - p of the frequencies is set to zero.
    p: float = 1.0

    def check(self, config: ModelFields, where: str) -> None:
        if not 0 < self.fraction <= 1 or not 0 <= self.p <= 1:
            raise ConfigError(f"{where}: fraction must be in (0, 1] and p in [0, 1], got {self.fraction} and {self.p}")
        rotated = rotary_dim(self.fraction, config.head_dim)
        if rotated < 2 or rotated % 2:
            raise ConfigError(f"{where}.fraction = {self.fraction} rotates {rotated} of the {config.head_dim} "
                              "dimensions of a head; it must give an even number >= 2")


def keep_highest_frequencies(inv_freq: torch.Tensor, p: float) -> torch.Tensor:
    """p-RoPE: keep the int(p * n) highest of the n frequencies (inv_freq is in decreasing order), zero the rest."""
    kept = int(p * inv_freq.numel() + 1e-9)
    return torch.where(torch.arange(inv_freq.numel(), device=inv_freq.device) < kept, inv_freq,
                       torch.zeros_like(inv_freq))


@register_encoding("rope")
class RoPE(PositionEncoding):
    """Rotary embedding (Su et al. 2021) with an optional scaling from model.methods.ROPE_SCALINGS, partial rotary
    (the `fraction` setting) and p-RoPE (`p`). It reads the model-level rope_theta, rope_layout and rope_scaling
    (transformers' names, shared with the Hugging Face mapping and the scaling methods).

    transformers' convention: cos and sin are multiplied by the attention factor, so q and k are each
    scaled by it and the logits by its square (YaRN's sqrt(1/t) on q and k). It is applied once, here.
    """

    Settings = RotarySettings
    model_settings = ("rope_theta", "rope_layout", "rope_scaling")
    per_layer_rope = True
    key_tables_differ = False  # keys use the queries' tables at the same positions
    exact_buffers = ("inv_freq", "variant_inv_freq")

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.scaling = config.rope_scaling or {"rope_type": "default"}
        self.scaling_name = self.scaling["rope_type"]
        self.init_fn = ROPE_SCALINGS[self.scaling_name]
        self.rotary_dim = rotary_dim(self.settings.fraction, config.head_dim)
        # Dynamic NTK changes the base with the length, so keys are cached raw and rotated at every step.
        self.caches_encoded_keys = not self.init_fn.length_dependent
        # The variants of the layers using it (model.rope_theta_layers, rope_scaling_layers): (theta, scaled) each;
        # one, (rope_theta, True), unless those lists set RoPE per layer.
        thetas, scaled = config.layer_rope_thetas, config.layer_rope_scaled
        layers = self.layers_using() or range(config.n_layers)  # none: a rotation another encoding holds (SSMax's)
        self.variants = list(dict.fromkeys((thetas[layer], scaled[layer]) for layer in layers))
        self.variant_of = {layer: self.variants.index((thetas[layer], scaled[layer])) for layer in layers}
        tables = [self.variant_frequencies(variant, None) for variant in self.variants]
        # Derived from the config, so not saved with the weights (rebuilt on load).
        self.register_buffer("inv_freq", tables[0][0], persistent=False)
        self.attention_factor = tables[0][1]
        self.register_buffer("variant_inv_freq", torch.stack([inv_freq for inv_freq, _ in tables]), persistent=False)
        self.variant_factors = [factor for _, factor in tables]

    def variant_frequencies(self, variant: tuple[float, bool], seq_len: int | None) -> tuple[torch.Tensor, float]:
        """inv_freq and the attention factor of one (theta, scaled) variant: the scaling where it applies."""
        theta, scaled = variant
        if scaled and self.scaling_name != "default":
            inv_freq, attention_factor = self.init_fn(self.rotary_dim, theta, self.scaling, seq_len)
        else:  # plain RoPE
            inv_freq, attention_factor = default_inv_freq(self.rotary_dim, theta), 1.0
        return keep_highest_frequencies(inv_freq, self.settings.p), attention_factor

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        if config.head_dim % 2:
            raise ConfigError(f"{cls.name} needs an even head_dim, got {config.head_dim} (dim / n_heads)")

    def frequencies(self, k_positions: torch.Tensor, variant: int = 0) -> tuple[torch.Tensor, float]:
        if self.caches_encoded_keys:
            if variant == 0:
                return self.inv_freq, self.attention_factor
            return self.variant_inv_freq[variant], self.variant_factors[variant]
        seq_len = int(k_positions.max()) + 1
        inv_freq, attention_factor = self.variant_frequencies(self.variants[variant], seq_len)
        return inv_freq.to(k_positions.device), attention_factor

    def tables(self, inv_freq: torch.Tensor, positions: torch.Tensor, attention_factor: float,
               keys: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (batch|1, 1, time, rotary_dim) for queries or keys at `positions`."""
        cos, sin = rope_cos_sin(inv_freq, positions, self.config.rope_layout, attention_factor)
        return cos[:, None], sin[:, None]

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor,
                all_keys: bool = False) -> RopeState | RopeStates:
        """The tables of this forward: once for all layers, or once per variant when RoPE is set per layer."""
        if len(self.variants) > 1:
            return RopeStates([self.prepare_variant(q_positions, k_positions, all_keys, variant)
                               for variant in range(len(self.variants))], self.variant_of)
        return self.prepare_variant(q_positions, k_positions, all_keys)

    def for_layer(self, x: torch.Tensor, state: Any, layer: int, kv_cache: Any = None) -> Any:
        return state.states[state.variant_of[layer]] if isinstance(state, RopeStates) else state

    def prepare_variant(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False,
                        variant: int = 0) -> RopeState:
        inv_freq, attention_factor = self.frequencies(k_positions, variant)
        q_cos, q_sin = self.tables(inv_freq, q_positions, attention_factor, keys=False)
        # Keys rotated before caching are the new ones, at the query positions; else all keys, rotated again.
        k_positions = q_positions if self.caches_encoded_keys and not all_keys else k_positions
        if k_positions is q_positions and not self.key_tables_differ:
            return RopeState(q_cos, q_sin, q_cos, q_sin)
        k_cos, k_sin = self.tables(inv_freq, k_positions, attention_factor, keys=True)
        return RopeState(q_cos, q_sin, k_cos, k_sin)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim == x.shape[-1]:
            return apply_rope(x, cos, sin, self.config.rope_layout, self.compiled_rope)
        rotated = apply_rope(x[..., : self.rotary_dim], cos, sin, self.config.rope_layout,
                             self.compiled_rope)
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)

    def encode_queries(self, q: torch.Tensor, state: RopeState) -> torch.Tensor:
        return self.rotate(q, state.q_cos, state.q_sin)

    def encode_keys(self, k: torch.Tensor, state: RopeState) -> torch.Tensor:
        return self.rotate(k, state.k_cos, state.k_sin)

    def key_tables(self, state: Any) -> tuple[torch.Tensor, ...] | None:
        return (state.k_cos, state.k_sin) if isinstance(state, RopeState) else None

    def keys_from(self, state: RopeState, start: int) -> RopeState:
        return RopeState(state.q_cos, state.q_sin, state.k_cos[..., start:, :], state.k_sin[..., start:, :])


def xpos_zeta(rotated: int) -> torch.Tensor:
    """torchscale's XPOS decay rates, one per rotated pair: zeta_i = (2i + 0.4 d) / (1.4 d), in (0.28, 1)."""
    return (torch.arange(0, rotated, 2, dtype=torch.float32) + 0.4 * rotated) / (1.4 * rotated)


# |exponent| of the largest scale factor a table may hold: e^80 ~ 5.5e34 is still finite in float32 and bfloat16.
XPOS_MAX_LOG_SCALE = 80.0


def xpos_position_limit(scale_base: float, rotated: int) -> int:
    """The largest position whose xPos key scale stays below e^XPOS_MAX_LOG_SCALE, for `rotated` dimensions."""
    smallest_log_zeta = float(torch.log(xpos_zeta(rotated)).min())
    return int(XPOS_MAX_LOG_SCALE * scale_base / -smallest_log_zeta)


@dataclass
class XPosSettings(RotarySettings):
    scale_base: float = 512.0  # the decay's scale base gamma (torchscale's scale_base)

    def check(self, config: ModelFields, where: str) -> None:
        super().check(config, where)
        if self.scale_base <= 0:
            raise ConfigError(f"{where}.scale_base must be positive, got {self.scale_base}")
        limit = xpos_position_limit(self.scale_base, rotary_dim(self.fraction, config.head_dim))
        if config.max_seq_len > limit:
            raise ConfigError(f"xpos: model.max_seq_len = {config.max_seq_len} overflows the decay scale (limit "
                              f"{limit} at {where}.scale_base = {self.scale_base:g}); raise the scale base")


@register_encoding("xpos")
class XPos(RoPE):
    """xPos (Sun et al. 2022): RoPE with an exponential decay; the scales are folded into the cos/sin tables, so
    encode_queries / encode_keys are RoPE's. Positions are absolute (no centring), so the key scale grows as
    zeta_min^(-m / gamma): positions beyond about 80 gamma / |ln zeta_min| (32,700 at gamma = 512) are an error."""

    Settings = XPosSettings
    model_settings = ("rope_theta", "rope_layout")
    key_tables_differ = True
    exact_buffers = ("inv_freq", "log_zeta")

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.register_buffer("log_zeta", torch.log(xpos_zeta(self.rotary_dim)), persistent=False)
        self.position_limit = xpos_position_limit(self.settings.scale_base, self.rotary_dim)

    def tables(self, inv_freq: torch.Tensor, positions: torch.Tensor, attention_factor: float,
               keys: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = super().tables(inv_freq, positions, attention_factor, keys)
        gamma = self.settings.scale_base
        # Compiled, the range check would break the graph at a data-dependent float(): it is skipped there (a
        # compiled training step stays below max_seq_len, which the settings check keeps within the limit).
        if positions.numel() and not torch.compiler.is_compiling():
            largest = int(positions.abs().max())
            if largest > self.position_limit:
                raise PositionRangeError(f"xpos: position {largest} overflows the decay scale (limit "
                                         f"{self.position_limit} at model.position_args.xpos.scale_base = {gamma:g}); evaluate "
                                         "shorter sequences")
        with torch.autocast(device_type=positions.device.type, enabled=False):
            exponent = positions.to(torch.float32)[..., None] / gamma * self.log_zeta.to(positions.device)
            if keys:
                exponent = -exponent
            scale = torch.exp(exponent)  # (batch|1, time, rotary_dim / 2)
            if self.config.rope_layout == "half":
                scale = torch.cat((scale, scale), dim=-1)
            else:
                scale = torch.repeat_interleave(scale, 2, dim=-1)
            scale = scale[:, None]
        return cos * scale, sin * scale
