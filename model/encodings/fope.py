"""fope: Fourier Position Embedding (Hua et al., ICML 2025, "Fourier Position Embedding: Enhancing Attention's
Periodic Extension for Length Generalization", arXiv 2412.17739).

RoPE gives pair i of a head one frequency omega_i = rope_theta^(-2i / d). FoPE makes each pair a Fourier series
over several frequencies, and clips the frequencies too low to complete a period within the trained length L
(omega < 2 pi / L: under-trained, so they extrapolate badly) to zero. With the K frequencies that remain, the
cos and sin that rotate pair o of head h at position n are

    C_ho(n) = sum_k cos(omega_k n) A_hko,    S_ho(n) = sum_k sin(omega_k n) B_hko,

q_pair -> (q1 C - q2 S, q2 C + q1 S) on queries and keys alike (RoPE's half layout). There are O = min(K, d / 4)
such pairs; every other pair gets C = S = 1, a fixed map (the same 45-degree rotation times sqrt 2 on queries and
keys) that carries no position. A and B start as the identity (a stepped identity when K > O) plus Xavier-normal
noise of gain 0.3, and stay fixed unless `learnable`.

As the authors' code (olmo/model.py's FourierEmbedding, at the first author's commit 54faf95, with the settings
of the paper's configs: rope_clamp_floor_freq and rope_clamp_floor_to_zero, fourier_ignore_zero,
fourier_separate_basis, fourier_separate_head, fourier_init "eye_xavier_norm" with gain 0.3, fourier_learnable
false), checked against it in tests/test_outside_references.py. Where ours differs: the coefficients belong to each
key head and are shared by the query heads it serves (as vLLM's FourierRotaryEmbedding), which is the authors' per
head when n_kv_heads = n_heads; the paper calls the clipped pairs zero-frequency (cos 1, sin 0), the code pads
both cos and sin with 1, and so do we.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from errors import ConfigError
from model.encodings import EncodingSettings, PositionEncoding, register_encoding
from model.fields import ModelFields
from model.rope import apply_rope, default_inv_freq


@dataclass
class FourierSettings(EncodingSettings):
    # The length L whose frequency 2 pi / L is the floor: frequencies below it are clipped (0: model.max_seq_len,
    # the trained length, written into the saved config so an extension keeps the same frequencies).
    floor_length: int = 0
    init_gain: float = 0.3  # the Xavier-normal gain of the coefficients' noise around the identity
    learnable: bool = False  # the authors' code keeps the coefficients fixed at their random initial values

    def check(self, config: ModelFields, where: str) -> None:
        if self.floor_length < 0 or self.init_gain < 0:
            raise ConfigError(f"{where}: floor_length must be >= 0 (0: model.max_seq_len) and init_gain >= 0, got "
                              f"{self.floor_length} and {self.init_gain}")
        length = self.floor_length or config.max_seq_len
        if not kept_frequencies(config.head_dim, config.rope_theta, length).numel():
            raise ConfigError(f"{where}: at a floor length of {length} tokens no frequency of a {config.head_dim}-"
                              f"dimensional head completes a period (2 pi / {length} is above them all); use a "
                              "longer model.max_seq_len or floor_length")

    def complete(self, config: ModelFields) -> None:
        self.floor_length = self.floor_length or config.max_seq_len


def kept_frequencies(head_dim: int, theta: float, floor_length: int) -> torch.Tensor:
    """RoPE's frequencies at or above the floor 2 pi / floor_length, in decreasing order, float32."""
    inv_freq = default_inv_freq(head_dim, theta)
    return inv_freq[inv_freq >= 2 * math.pi / floor_length]


def stepped_identity(inputs: int, outputs: int) -> torch.Tensor:
    """(inputs, outputs): the identity when they are equal; else output o reads input o * ceil(inputs / outputs)."""
    step = math.ceil(inputs / outputs)
    eye = torch.zeros(inputs, outputs)
    for output in range(outputs):
        if output * step < inputs:
            eye[output * step, output] = 1.0
    return eye


@dataclass
class FourierBasis:
    """cos and sin of every kept frequency at the query positions (batch|1, q_time, K) and at the positions of the
    keys encoded in this forward (batch|1, k_time, K), float32."""

    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor


@dataclass
class FourierTables:
    """One layer's cos and sin tables, (batch|1, heads or kv_heads, time, head_dim), float32."""

    q_cos: torch.Tensor
    q_sin: torch.Tensor
    k_cos: torch.Tensor
    k_sin: torch.Tensor


@register_encoding("fope")
class FoPE(PositionEncoding):
    """Fourier series over RoPE's trained frequencies, the under-trained ones clipped."""

    Settings = FourierSettings
    model_settings = ("rope_theta",)
    relative_only = False  # a pair's C and S mix frequencies: the logits depend on the positions, not their distance
    exact_buffers = ("inv_freq",)
    # The coefficients, when learnable: the model's learning rate, no weight decay (the authors decay nothing of
    # them, being fixed).
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        inv_freq = kept_frequencies(config.head_dim, config.rope_theta, self.settings.floor_length)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.inputs = inv_freq.numel()
        self.outputs = min(self.inputs, config.head_dim // 4)
        self.groups = config.n_heads // config.n_kv_heads
        shape = (config.n_kv_heads, self.inputs, self.outputs)
        # A and B of every layer that uses FoPE (a hybrid's other layers get none), per key head: parameters even
        # when fixed, so that they are saved with the weights and shared by the model's inference-time views.
        learnable = self.settings.learnable
        self.cos_coef = nn.ParameterDict({str(index): nn.Parameter(torch.empty(shape), requires_grad=learnable)
                                          for index in self.layers_using()})
        self.sin_coef = nn.ParameterDict({str(index): nn.Parameter(torch.empty(shape), requires_grad=learnable)
                                          for index in self.layers_using()})
        self.reset_parameters()

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        if config.head_dim % 2 or config.head_dim < 4:
            raise ConfigError(f"fope needs an even head_dim of at least 4 (its Fourier pairs are d / 4 at most), got "
                              f"{config.head_dim}")

    @torch.no_grad()
    def reset_parameters(self) -> None:
        eye = stepped_identity(self.inputs, self.outputs)
        for coefficients in (*self.cos_coef.values(), *self.sin_coef.values()):
            nn.init.xavier_normal_(coefficients, gain=self.settings.init_gain)
            coefficients += eye.to(coefficients.device)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (torch's signature)
        """Casting the model keeps the coefficients float32, as the tables they make (a bf16 coefficient is a
        table error at every position)."""
        module = super()._apply(fn, recurse)
        for coefficients in (*self.cos_coef.values(), *self.sin_coef.values()):
            coefficients.data = coefficients.data.float()
        return module

    def basis(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of omega_k n, (batch|1, time, K), float32 whatever the autocast state."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            angles = positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)
            return angles.cos(), angles.sin()

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> FourierBasis:
        q_cos, q_sin = self.basis(q_positions)
        if not all_keys:  # keys are encoded before caching: the new ones, at the query positions
            return FourierBasis(q_cos, q_sin, q_cos, q_sin)
        return FourierBasis(q_cos, q_sin, *self.basis(k_positions))

    def series(self, basis: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
        """sum_k basis_k A_hko for each kv head, padded with 1 to d / 2 pairs and laid out as RoPE's half layout:
        (batch|1, kv_heads, time, head_dim)."""
        with torch.autocast(device_type=basis.device.type, enabled=False):
            mixed = torch.einsum("btk,hko->bhto", basis, coefficients.float())
            pad = self.config.head_dim // 2 - self.outputs
            mixed = torch.cat((mixed, mixed.new_ones(*mixed.shape[:-1], pad)), dim=-1)
            return torch.cat((mixed, mixed), dim=-1)

    def for_layer(self, x: torch.Tensor, state: FourierBasis, layer: int, kv_cache: Any = None) -> FourierTables:
        cos_coef, sin_coef = self.cos_coef[str(layer)], self.sin_coef[str(layer)]
        k_cos, k_sin = self.series(state.k_cos, cos_coef), self.series(state.k_sin, sin_coef)
        if state.q_cos is state.k_cos:
            q_cos, q_sin = k_cos, k_sin
        else:
            q_cos, q_sin = self.series(state.q_cos, cos_coef), self.series(state.q_sin, sin_coef)
        # Query head i uses key head i // groups, as grouped-query attention pairs them.
        return FourierTables(q_cos.repeat_interleave(self.groups, dim=1), q_sin.repeat_interleave(self.groups, dim=1),
                             k_cos, k_sin)

    def encode_queries(self, q: torch.Tensor, state: FourierTables) -> torch.Tensor:
        return apply_rope(q, state.q_cos, state.q_sin, "half", self.compiled_rope)

    def encode_keys(self, k: torch.Tensor, state: FourierTables) -> torch.Tensor:
        return apply_rope(k, state.k_cos, state.k_sin, "half", self.compiled_rope)
