"""alpha-entmax (Peters, Niculae and Martins, ACL 2019, "Sparse Sequence-to-Sequence Models"): scores to weights
like softmax, but with exact zeros.

    entmax_alpha(z)_j = [(alpha - 1) z_j - tau]_+ ^ (1 / (alpha - 1)),  tau such that the weights sum to 1;

alpha -> 1 is softmax, alpha = 2 sparsemax. For alpha = 1.5, Newton's method finds the support and tau follows from
it in closed form (as the entmax package's entmax15 computes it after sorting, several times slower on a CPU); for
alpha = 2, sorting (its sparsemax); for any other alpha in (1, 2), bisection to the dtype's precision (its
entmax_bisect). The gradient is the closed form dz = s (g - sum(g s) / sum(s)), s = p^(2 - alpha) where p > 0 and 0
elsewhere. Entries of -inf (hidden keys) get weight 0; each row needs one finite entry.
"""
from __future__ import annotations

import math

import torch


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
