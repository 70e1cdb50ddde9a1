"""How RoPE works, measured: the properties its derivation claims, computed with the project's own code.

    python -m scripts.rope_analysis --out results/rope [--head-dim 64] [--base 10000] [--length 256] [--factor 4]

Writes summary.md (every number below) and relative.png, decay.png, frequency_map.png, precision.png:
  1. permutation: attention without positions (and without a causal mask) is permutation-equivariant,
     so it cannot tell 猫追老鼠 from 老鼠追猫; RoPE breaks the symmetry.
  2. relative: q_m . k_n after rotation depends only on m - n (constant along diagonals).
  3. equivalences: the block-rotation matrix, the complex product q e^{i m theta}, and the elementwise
     form q cos + rotate(q) sin in both pair layouts give the same vectors.
  4. long-term decay: the Abel-summation bound (1/(d/2)) sum_j |S_j| shrinks with relative distance.
  5. frequency map: each pair's wavelength against the training length; which pairs YaRN keeps,
     interpolates or blends, next to linear interpolation and NTK.
  6. precision: one frequency of 1 turn per 10^6 tokens cannot separate neighbouring offsets in float32.
  7. linear attention: RoPE in a linear-attention numerator keeps scores relative, and prefix sums still work.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from commands import add_out, command_parser, parse, renamed
from errors import ConfigError, cli_command
from eval.figures import save as save_figure
from model.attention import Attention
from model.config import ModelConfig
from model.encodings import POSITION_ENCODINGS
from model.methods import ROPE_SCALINGS
from model.methods.yarn import yarn_ramp
from model.rope import apply_rope, default_inv_freq, rope_cos_sin

CAT, CHASES, MOUSE = "猫", "追", "老鼠"


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float, layout: str = "interleaved") -> torch.Tensor:
    """The project's RoPE (model.rope) in float64: x (..., time, d) rotated by `positions` (time,)."""
    inv_freq = default_inv_freq(x.shape[-1], base, torch.float64)
    cos, sin = rope_cos_sin(inv_freq, positions, layout, dtype=torch.float64)
    return apply_rope(x, cos, sin, layout)


def permutation_check(head_dim: int = 64, base: float = 1e4, seed: int = 0) -> dict[str, float]:
    """Attention without a causal mask through model.attention.Attention, NoPE vs RoPE, in float64."""
    torch.manual_seed(seed)
    results = {}
    for position in ("none", "rope"):
        config = ModelConfig(vocab_size=8, dim=head_dim * 2, n_heads=2, n_kv_heads=2, position=position, rope_theta=base)
        attention = Attention(config, 0).double().eval()
        for linear in (attention.q_proj, attention.k_proj):
            torch.nn.init.normal_(linear.weight, std=0.3)  # sharp enough that attention is far from uniform
        encoding = POSITION_ENCODINGS[config.position](config)
        words = {CAT: torch.randn(config.dim), CHASES: torch.randn(config.dim), MOUSE: torch.randn(config.dim)}
        x = torch.stack([torch.randn(config.dim) for _ in range(16)])[None].double()
        permutation = torch.randperm(16)

        def attend(inputs: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(inputs.shape[1])[None]
            with torch.no_grad():
                return attention(inputs, encoding, encoding.prepare(positions, positions), None, causal=False)

        results[f"{position}_permutation_diff"] = float((attend(x)[:, permutation] - attend(x[:, permutation])).abs().max())
        sentence = torch.stack([words[CAT], words[CHASES], words[MOUSE]])[None].double()
        reversed_sentence = torch.stack([words[MOUSE], words[CHASES], words[CAT]])[None].double()
        # The output at 猫 (cat) in 猫追老鼠 vs in 老鼠追猫.
        results[f"{position}_cat_output_diff"] = float((attend(sentence)[0, 0] - attend(reversed_sentence)[0, 2]).abs().max())
    return results


def relative_scores(head_dim: int = 64, base: float = 1e4, length: int = 64, seed: int = 0) -> tuple[torch.Tensor, float]:
    """Scores q_m . k_n for one fixed q and k at every (m, n), and the largest spread along any diagonal."""
    torch.manual_seed(seed)
    q, k = torch.randn(head_dim, dtype=torch.float64), torch.randn(head_dim, dtype=torch.float64)
    positions = torch.arange(length)
    rotated_q = rotate(q.expand(length, head_dim), positions, base)
    rotated_k = rotate(k.expand(length, head_dim), positions, base)
    scores = rotated_q @ rotated_k.T
    spread = max(float(torch.diagonal(scores, offset).max() - torch.diagonal(scores, offset).min())
                 for offset in range(-length + 1, length))
    return scores, spread


def rotation_matrix(head_dim: int, position: int, base: float) -> torch.Tensor:
    """The sparse block-diagonal rotation R_m of pairs (2i, 2i+1), built entry by entry."""
    inv_freq = default_inv_freq(head_dim, base, torch.float64)
    matrix = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for i, theta in enumerate(inv_freq.tolist()):
        angle = position * theta
        matrix[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)
    return matrix


def equivalences(head_dim: int = 64, base: float = 1e4, positions: tuple[int, ...] = (0, 1, 7, 100, 5000)) -> dict[str, float]:
    """Max abs difference of each form against the rotation matrix, over several positions."""
    torch.manual_seed(1)
    q = torch.randn(head_dim, dtype=torch.float64)
    inv_freq = default_inv_freq(head_dim, base, torch.float64)
    half_order = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    back = torch.argsort(half_order)
    worst = {"complex": 0.0, "interleaved": 0.0, "half": 0.0}
    for position in positions:
        reference = rotation_matrix(head_dim, position, base) @ q
        pairs = torch.view_as_complex(q.view(-1, 2).contiguous())
        complex_form = torch.view_as_real(pairs * torch.polar(torch.ones_like(inv_freq), position * inv_freq)).flatten()
        interleaved = rotate(q[None], torch.tensor([position]), base, "interleaved")[0]
        half = rotate(q[half_order][None], torch.tensor([position]), base, "half")[0][back]
        for name, value in (("complex", complex_form), ("interleaved", interleaved), ("half", half)):
            worst[name] = max(worst[name], float((value - reference).abs().max()))
    return worst


def abel_bound(head_dim: int, base: float, distances: torch.Tensor) -> torch.Tensor:
    """(1/(d/2)) sum_j |S_j| with S_j = sum_{k<j} e^{i r theta_k}, for each relative distance r (RoFormer 3.4.3)."""
    inv_freq = default_inv_freq(head_dim, base, torch.float64)
    phases = torch.polar(torch.ones(len(distances), len(inv_freq), dtype=torch.float64),
                         distances.to(torch.float64)[:, None] * inv_freq)
    partial_sums = torch.cumsum(phases, dim=-1)
    return partial_sums.abs().mean(dim=-1)


def frequency_map(head_dim: int, base: float, train_len: int, factor: float) -> dict[str, torch.Tensor]:
    """Wavelength (tokens per turn) of each pair: original, linear, NTK and YaRN; YaRN's ramp per pair."""
    params = {"factor": factor, "original_max_position_embeddings": train_len}
    wavelength = {name: 2 * math.pi / ROPE_SCALINGS[name](head_dim, base, params)[0].double()
                  for name in ("default", "linear", "ntk", "yarn")}
    wavelength["ramp"] = yarn_ramp(head_dim, base, params).double()
    return wavelength


def neighbour_scores(inv_freq: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Score of a query with an identical key at each relative offset: mean over pairs of cos(offset * theta)."""
    cos, _ = rope_cos_sin(inv_freq.to(dtype), offsets, "interleaved", dtype=dtype)
    return cos[:, 0::2].mean(dim=-1)


def precision(head_dim: int = 64, base: float = 1e4, period: float = 1e6, max_offset: int = 2000) -> dict[str, dict]:
    """For one frequency of 1 turn per `period` tokens and for the full RoPE spectrum: how many neighbouring
    offsets (r, r + 1), r < max_offset, give identical scores in float32 and in float64."""
    offsets = torch.arange(max_offset + 1)
    spectra = {"single low frequency": torch.tensor([2 * math.pi / period], dtype=torch.float64),
               "multi-frequency RoPE": default_inv_freq(head_dim, base, torch.float64)}
    table = {}
    for name, inv_freq in spectra.items():
        for dtype in (torch.float32, torch.float64):
            scores = neighbour_scores(inv_freq, offsets, dtype)
            same = (scores[1:] == scores[:-1])
            table[f"{name}, {str(dtype).split('.')[-1]}"] = {
                "score(0) - score(1)": float(scores[0].double() - scores[1].double()),
                "identical neighbours": int(same.sum()),
                "of": max_offset,
                "scores": scores.double(),
            }
    return table


def linear_attention_check(head_dim: int = 64, base: float = 1e4, length: int = 48, shift: int = 1000) -> dict[str, float]:
    """RoPE on the feature-mapped q and k of causal linear attention (RoFormer eq. 19)."""
    torch.manual_seed(2)
    q, k = torch.randn(length, head_dim, dtype=torch.float64), torch.randn(length, head_dim, dtype=torch.float64)
    v = torch.randn(length, head_dim, dtype=torch.float64)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    positions = torch.arange(length)

    def numerator(offset: int) -> torch.Tensor:
        return rotate(phi_q, positions + offset, base) @ rotate(phi_k, positions + offset, base).T

    scores = numerator(0)
    causal = torch.tril(torch.ones(length, length, dtype=torch.float64))
    quadratic = ((scores * causal) @ v) / ((phi_q @ phi_k.T) * causal).sum(-1, keepdim=True)
    # The linear-time form: prefix sums of (R_n phi(k_n)) v_n^T, then one product per query.
    rotated_q, rotated_k = rotate(phi_q, positions, base), rotate(phi_k, positions, base)
    state = torch.cumsum(rotated_k[:, :, None] * v[:, None, :], dim=0)  # (time, d, d)
    normaliser = torch.cumsum(phi_k, dim=0)
    prefix = torch.einsum("td,tde->te", rotated_q, state) / (phi_q * normaliser).sum(-1, keepdim=True)
    return {"shift_diff": float((numerator(shift) - scores).abs().max()),
            "prefix_sum_vs_quadratic": float((prefix - quadratic).abs().max())}


def save_figures(out: Path, head_dim: int, base: float, train_len: int, factor: float) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    scores, _ = relative_scores(head_dim, base)
    figure, axis = plt.subplots(figsize=(5, 4.2))
    image = axis.imshow(scores.numpy(), cmap="coolwarm")
    axis.set_xlabel("key position n")
    axis.set_ylabel("query position m")
    axis.set_title("RoPE score q_m . k_n: constant along diagonals")
    figure.colorbar(image, ax=axis)
    save_figure(figure, out / "relative.png")

    distances = torch.arange(0, 4097)
    figure, axis = plt.subplots(figsize=(7, 4))
    for value in (1e4, 1e6):
        axis.plot(distances.numpy(), abel_bound(head_dim, value, distances).numpy(), label=f"base {value:g}", linewidth=1)
    axis.set_xscale("symlog", linthresh=10)
    axis.set_xlabel("relative distance (tokens)")
    axis.set_ylabel("(1/(d/2)) sum_j |S_j|")
    axis.set_title(f"Long-term decay of the RoPE bound (d = {head_dim})")
    axis.grid(True, alpha=0.3)
    axis.legend()
    save_figure(figure, out / "decay.png")

    waves = frequency_map(head_dim, base, train_len, factor)
    pairs = torch.arange(head_dim // 2)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, style in (("default", "k-"), ("linear", "--"), ("ntk", "-."), ("yarn", "-")):
        axis.plot(pairs.numpy(), waves[name].numpy(), style, label=name if name != "default" else "RoPE", linewidth=1.2)
    ramp = waves["ramp"]
    for pair in pairs.tolist():
        color = "tab:green" if ramp[pair] == 0 else ("tab:red" if ramp[pair] == 1 else "tab:orange")
        axis.axvspan(pair - 0.5, pair + 0.5, color=color, alpha=0.12, linewidth=0)
    axis.axhline(train_len, color="grey", linestyle=":", label=f"training length {train_len}")
    axis.set_yscale("log")
    axis.set_xlabel("frequency pair i (green: YaRN keeps, orange: blends, red: interpolates)")
    axis.set_ylabel("wavelength 2 pi / theta_i (tokens)")
    axis.set_title(f"Which frequencies each scaling changes (factor {factor:g})")
    axis.legend(fontsize=8)
    save_figure(figure, out / "frequency_map.png")

    table = precision(head_dim, base, max_offset=2000)
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for axis, name in zip(axes, ("single low frequency", "multi-frequency RoPE")):
        for dtype in ("float32", "float64"):
            scores = table[f"{name}, {dtype}"]["scores"][:40]
            axis.plot((scores - scores[0]).numpy(), "o-" if dtype == "float32" else "x--", markersize=3, label=dtype)
        axis.set_title(name)
        axis.set_xlabel("relative offset r")
        axis.set_ylabel("score(r) - score(0)")
        axis.legend()
        axis.grid(True, alpha=0.3)
    save_figure(figure, out / "precision.png")
    figures.update(relative="relative.png", decay="decay.png", frequency_map="frequency_map.png",
                   precision="precision.png")
    return figures


def write_summary(out: Path, head_dim: int, base: float, train_len: int, factor: float) -> str:
    permutation = permutation_check(head_dim, base)
    _, spread = relative_scores(head_dim, base)
    forms = equivalences(head_dim, base)
    distances = torch.tensor([0, 1, 10, 100, 1000, 4096])
    decay = {value: abel_bound(head_dim, value, distances) for value in (1e4, 1e6)}
    waves = frequency_map(head_dim, base, train_len, factor)
    ramp = waves["ramp"]
    table = precision(head_dim, base)
    linear = linear_attention_check(head_dim, base)
    lines = [
        f"# How RoPE works, measured (head_dim {head_dim}, base {base:g}, training length {train_len}, factor {factor:g})",
        "",
        "## 1. Without positions, order is invisible",
        f"Attention with no position encoding and no causal mask (model.attention.Attention, float64): permuting 16 "
        f"inputs permutes the outputs, max difference {permutation['none_permutation_diff']:.1e}; with RoPE "
        f"{permutation['rope_permutation_diff']:.2e}. The output at {CAT} is the same in {CAT}{CHASES}{MOUSE} and "
        f"{MOUSE}{CHASES}{CAT} without positions (difference {permutation['none_cat_output_diff']:.1e}) and differs with "
        f"RoPE ({permutation['rope_cat_output_diff']:.2e}).",
        "",
        "## 2. Scores depend only on m - n",
        f"For one q and one k rotated to every position 0..63, the largest spread of q_m . k_n along any diagonal "
        f"is {spread:.1e} (float64). ![relative](relative.png)",
        "",
        "## 3. Four ways to write the rotation agree",
        f"Against the sparse block-rotation matrix R_m q: complex product q e^(i m theta) {forms['complex']:.1e}, "
        f"elementwise interleaved pairs {forms['interleaved']:.1e}, elementwise half-split pairs (after permuting "
        f"dimensions) {forms['half']:.1e} (max abs difference over positions 0, 1, 7, 100, 5000).",
        "",
        "## 4. Long-term decay",
        "The Abel-summation bound (1/(d/2)) sum_j |S_j| at relative distances "
        + ", ".join(str(int(d)) for d in distances) + ": base 1e4 "
        + ", ".join(f"{v:.2f}" for v in decay[1e4].tolist()) + "; base 1e6 "
        + ", ".join(f"{v:.2f}" for v in decay[1e6].tolist()) + ". ![decay](decay.png)",
        "",
        "## 5. Which frequencies each scaling touches",
        f"Of {head_dim // 2} pairs, YaRN keeps {int((ramp == 0).sum())} (wavelengths short enough to turn more than "
        f"beta_fast = 32 times in {train_len} tokens), interpolates {int((ramp == 1).sum())} (fewer than beta_slow = 1 "
        f"turn) and blends {int(((ramp > 0) & (ramp < 1)).sum())}. Linear interpolation stretches every wavelength by "
        f"{factor:g}; NTK stretches the longest by {float(waves['ntk'][-1] / waves['default'][-1]):.2f} and the "
        f"shortest by {float(waves['ntk'][0] / waves['default'][0]):.2f}. Pairs whose wavelength exceeds the "
        f"training length: {int((waves['default'] > train_len).sum())}. ![frequency map](frequency_map.png)",
        "",
        "## 6. One low frequency cannot tell neighbours apart in float32",
        "| spectrum, precision | score(0) - score(1) | identical neighbouring offsets (r, r+1), r < 2000 |",
        "|---|---:|---:|",
    ]
    for name, row in table.items():
        lines.append(f"| {name} | {row['score(0) - score(1)']:.3e} | {row['identical neighbours']} of {row['of']} |")
    lines += [
        "",
        "At 1 turn per 10^6 tokens, cos(theta) - 1 is about -2e-11, below float32's resolution near 1 "
        "(6e-8): in float32 the score cannot separate offsets 0 and 1. High frequencies resolve neighbours, "
        "low ones cover long range, so RoPE uses a spectrum. ![precision](precision.png)",
        "",
        "## 7. RoPE fits linear attention",
        f"With phi = elu + 1 and RoPE applied to phi(q) and phi(k): shifting every position by 1000 changes the "
        f"numerator scores by {linear['shift_diff']:.1e}, and the linear-time prefix-sum form equals the quadratic "
        f"form within {linear['prefix_sum_vs_quadratic']:.1e}. RoPE only touches q and k, so the kernel trick "
        "survives; a bias added to the scores (ALiBi, T5) needs the full score matrix.",
    ]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.rope_analysis", __doc__)
    add_out(parser, "output folder: summary.md and the figures (required)", type=Path)
    parser.add_argument("--head-dim", type=int, default=64, help="head dimension d (even)")
    parser.add_argument("--base", type=float, default=10000.0, help="RoPE base (theta)")
    parser.add_argument("--length", type=int, default=256, help="the training length L the scalings refer to")
    renamed(parser, "--train-len", "--length")
    parser.add_argument("--factor", type=float, default=4.0, help="scaling factor of the frequency map")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv, "out")
    if args.head_dim % 2 or args.head_dim < 4 or args.base <= 1 or args.length < 1 or args.factor < 1:
        raise ConfigError("need an even --head-dim >= 4, --base > 1, --length >= 1 and --factor >= 1")
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    save_figures(args.out, args.head_dim, args.base, args.length, args.factor)
    print(write_summary(args.out, args.head_dim, args.base, args.length, args.factor))
    print(f"wrote {args.out} in {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
