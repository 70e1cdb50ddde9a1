"""asentmax: Adaptive-Scalable Entmax (Vasylenko et al., ICLR 2026, "Long-Context Generalization with Sparse
Attention", arXiv 2506.16640): alpha-entmax weights instead of softmax (exact zeros for keys below a threshold), the
logits of each query scaled by a temperature learned from the content that grows with the number of keys seen.

Query i's weights are alpha-entmax(s_i q_i . k_j / sqrt(d)) over the keys it sees (entmax below), with s_i =
delta + beta_i (log(n_i + 1))^gamma_i, beta_i = softplus(w_beta . x_i) and gamma_i = gamma_range tanh(w_gamma . x_i)
per head, x_i the layer's input at the query, n_i the number of keys it sees (the count SSMax uses: the query's
position less the first key's, plus one, at most the layer's window). As the authors' code (deep-spin/asentmax,
synthetic/src/models/architectures/sparse_gemma.py, attn_scale_type "adapt-softplus-tanh": linear maps without a
bias, delta 1, gamma_range 2, log(position + 2) for a query at position 0, 1, ...; alpha 1.5). The authors' models
put ALiBi on half of the heads (NAPE: slopes 1, 1/2, ... on the first H/2 heads, the others NoPE and scaled); here
`base = "nape"` does so, and by default every head is NoPE and scaled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.encodings import ALL, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.encodings.ssmax import keys_seen, refuse_chunks
from model.fields import ModelFields

BASES = ("none", "nape")


# The weights: alpha-entmax (Peters, Niculae and Martins, ACL 2019, "Sparse Sequence-to-Sequence Models"), scores to
# weights like softmax, but with exact zeros.
#
#     entmax_alpha(z)_j = [(alpha - 1) z_j - tau]_+ ^ (1 / (alpha - 1)),  tau such that the weights sum to 1;
#
# alpha -> 1 is softmax, alpha = 2 sparsemax. For alpha = 1.5, Newton's method finds the support and tau follows from
# it in closed form (as the entmax package's entmax15 computes it after sorting, several times slower on a CPU); for
# alpha = 2, sorting (its sparsemax); for any other alpha in (1, 2), bisection to the dtype's precision (its
# entmax_bisect). The gradient is the closed form dz = s (g - sum(g s) / sum(s)), s = p^(2 - alpha) where p > 0 and 0
# elsewhere. Entries of -inf (hidden keys) get weight 0; each row needs one finite entry.


def entmax15(z: torch.Tensor) -> torch.Tensor:
    """1.5-entmax: with a = (z - max) / 2, tau solves sum_j [a_j - tau]_+^2 = 1. Newton's steps from tau = -1 (left of
    the root, where the maximum alone gives 1) rise to it without passing it, the convex function's tangents lying
    below it: about log2(n) / 2 steps halve the distance, two more converge on every input we tried (random, heavy
    tailed, clustered, evenly spaced, n = 8 to 4096), and two more are spent. Then tau exactly from the support S
    they found, as the sorting algorithm computes it: the smaller root of sum_S (a_j - tau)^2 = 1, mean_S -
    sqrt((1 - sum_S (a_j - mean_S)^2) / |S|). p = [a - tau]^2 (divided by its sum, which is then 1 to rounding)."""
    a = (z - z.amax(-1, keepdim=True)) * 0.5
    tau = torch.full_like(a[..., :1], -1.0)
    for _ in range(math.ceil(math.log2(z.shape[-1]) / 2) + 4):  # 2 more than any input we tried needed
        above = (a - tau).relu_()
        tau = tau + ((above * above).sum(-1, keepdim=True) - 1) / (2 * above.sum(-1, keepdim=True))
    support = a > tau
    size = support.sum(-1, keepdim=True)
    mean = torch.where(support, a, 0.0).sum(-1, keepdim=True) / size
    centred = torch.where(support, a - mean, 0.0)
    spread = (centred * centred).sum(-1, keepdim=True)
    p = (a - (mean - ((1 - spread) / size).clamp(min=0).sqrt())).relu_()
    p = p * p
    return p * (1 / p.sum(-1, keepdim=True))


def sparsemax(z: torch.Tensor) -> torch.Tensor:
    """2-entmax by sorting: with the top k of z sorted, tau_k = (their sum - 1) / k; the support is the leading k
    where tau_k is below the k-th largest; p = [z - tau]_+."""
    z = z - z.amax(-1, keepdim=True)
    ordered = z.sort(-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    tau = (ordered.masked_fill(~torch.isfinite(ordered), 0.0).cumsum(-1) - 1) / k  # -inf entries sort last
    size = (tau < ordered).to(torch.int32).cummin(-1).values.sum(-1, keepdim=True)
    return (z - tau.gather(-1, size - 1)).clamp(min=0)


def entmax_bisect(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax by bisection on tau in [max - 1, max - (1/n)^(alpha - 1)] (of (alpha - 1) z), to the dtype's
    precision; the weights then divided by their sum."""
    z = (alpha - 1) * (z - z.amax(-1, keepdim=True))
    low = torch.full_like(z[..., :1], -1.0)
    width = 1 - (1 / z.shape[-1]) ** (alpha - 1)
    for _ in range(round(-math.log2(torch.finfo(z.dtype).eps)) + 6):  # the mantissa's bits and a few more
        width /= 2
        middle = low + width
        enough = (z - middle).clamp(min=0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        low = torch.where(enough, middle, low)
    p = (z - low).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(-1, keepdim=True)


def entmax_forward(z: torch.Tensor, alpha: float) -> torch.Tensor:
    if alpha == 1.5:
        return entmax15(z)
    if alpha == 2.0:
        return sparsemax(z)
    return entmax_bisect(z, alpha)


class _Entmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, alpha: float) -> torch.Tensor:  # noqa: ANN001 (torch's signature)
        p = entmax_forward(z, alpha)
        ctx.save_for_backward(p)
        ctx.alpha = alpha
        return p

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001
        (p,) = ctx.saved_tensors
        s = (p > 0).to(p.dtype) if ctx.alpha == 2.0 else p.sqrt() if ctx.alpha == 1.5 else p.pow(2 - ctx.alpha)
        dz = grad * s
        return dz - s * dz.sum(-1, keepdim=True) / s.sum(-1, keepdim=True), None


def entmax(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax over the last dimension of z (floating point; -inf where an entry is hidden), alpha in (1, 2]."""
    return _Entmax.apply(z, alpha)


@dataclass
class ASEntmaxSettings(EncodingSettings):
    alpha: float = 1.5  # entmax's alpha, in (1, 2]: 1.5 and 2 (sparsemax) exact by sorting, others by bisection
    delta: float = 1.0  # the scale's floor
    gamma_range: float = 2.0  # the exponent gamma lies in (-gamma_range, gamma_range)
    base: str = "none"  # "none": every head NoPE and scaled; "nape": ALiBi on the first half of the heads

    def check(self, config: ModelFields, where: str) -> None:
        if not 1.0 < self.alpha <= 2.0:
            raise ConfigError(f"{where}.alpha must be in (1, 2] (1 would be softmax, 2 sparsemax), got {self.alpha}")
        if self.delta < 0:
            raise ConfigError(f"{where}.delta must be >= 0, got {self.delta}")
        if self.gamma_range < 0:
            raise ConfigError(f"{where}.gamma_range must be >= 0, got {self.gamma_range}")
        if self.base not in BASES:
            raise ConfigError(f"{where}.base must be one of {list(BASES)}, got {self.base!r}")
        if self.base == "nape" and config.n_heads < 2:
            raise ConfigError(f"{where}.base = 'nape' puts ALiBi on half of the heads and needs model.n_heads >= 2, "
                              f"got {config.n_heads}; use base = 'none'")


@dataclass
class ScaledQueries(Positions):
    """One layer's state: the positions and each query's factor s_i per head (batch, heads, q_time, 1), float32
    or float64 (1 on the ALiBi heads of NAPE)."""

    scale: torch.Tensor | None = None


def nape_slopes(heads: int) -> torch.Tensor:
    """ALiBi slopes 1, 1/2, ..., 1/(heads // 2) on the first half of the heads, 0 on the others (the authors'
    get_nape_slopes, "linear")."""
    alibi = heads // 2
    return torch.cat((1 / torch.arange(1, alibi + 1, dtype=torch.float32), torch.zeros(heads - alibi)))


@register_encoding("asentmax")
class ASEntmax(PositionEncoding):
    """alpha-entmax attention with a learned, length-adaptive temperature per query and head."""

    Settings = ASEntmaxSettings
    own_weights = True
    has_score_bias = True  # NAPE's ALiBi heads (none with base "none")
    why_explicit = "weights of its own instead of softmax"
    exact_buffers = ("slopes",)

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        refuse_chunks("asentmax", config)

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        heads = config.n_heads
        self.register_buffer("slopes", nape_slopes(heads) if self.settings.base == "nape" else torch.zeros(heads),
                             persistent=False)
        self.scaled = heads - heads // 2 if self.settings.base == "nape" else heads  # the last heads
        self.temperatures = nn.ModuleDict({
            str(index): nn.ModuleDict({"beta": nn.Linear(config.dim, self.scaled, bias=False),
                                       "gamma": nn.Linear(config.dim, self.scaled, bias=False)})
            for index in self.layers_using()})
        self.windows = config.layer_windows

    def for_layer(self, x: torch.Tensor, state: Positions, layer: int, kv_cache: Any = None) -> ScaledQueries:
        maps = self.temperatures[str(layer)]
        settings = self.settings
        exact = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for a reference
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(exact)
            beta = F.softplus(F.linear(x, maps["beta"].weight.to(exact))).transpose(1, 2)  # (batch, scaled, time)
            gamma = settings.gamma_range * torch.tanh(F.linear(x, maps["gamma"].weight.to(exact))).transpose(1, 2)
            n = keys_seen(state.queries, state.keys, self.windows[layer]).to(exact)  # (batch|1, time)
            scale = settings.delta + beta * torch.log(n + 1)[:, None, :] ** gamma
            heads = self.config.n_heads
            if self.scaled < heads:  # NAPE: the ALiBi heads keep their logits
                scale = torch.cat((scale.new_ones(scale.shape[0], heads - self.scaled, scale.shape[2]), scale), 1)
        return ScaledQueries(state.queries, state.keys, scale[..., None])

    def encode_queries(self, q: torch.Tensor, state: ScaledQueries) -> torch.Tensor:
        return q * state.scale.to(q.dtype)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor | None:
        if self.settings.base != "nape":
            return None
        return self.slopes[None, :, None, None] * state.relative(rows, keys)[:, None]  # m_h (j - i)

    def attention_weights(self, scores: torch.Tensor, state: Any, layer: int,
                          visible: torch.Tensor | None) -> torch.Tensor:
        with torch.autocast(device_type=scores.device.type, enabled=False):  # float32, or float64 for a reference
            return entmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), self.settings.alpha)

