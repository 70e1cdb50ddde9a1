"""Each numerical claim of scripts.rope_analysis, with a tolerance that can fail (and a control that differs)."""
import math

import torch

from model.methods.yarn import yarn_correction_range
from scripts.rope_analysis import (
    abel_bound,
    equivalences,
    frequency_map,
    linear_attention_check,
    main,
    permutation_check,
    precision,
    relative_scores,
    rotate,
)


def test_nope_is_permutation_equivariant_and_rope_is_not():
    result = permutation_check()
    assert result["none_permutation_diff"] < 1e-12
    assert result["none_cat_output_diff"] < 1e-12  # 猫追老鼠 and 老鼠追猫 look the same at 猫
    assert result["rope_permutation_diff"] > 1e-2
    assert result["rope_cat_output_diff"] > 1e-2


def test_scores_are_constant_along_diagonals_in_float64():
    scores, spread = relative_scores(64, 1e4)
    assert spread < 1e-5
    assert scores.std() > 0.1  # not constant overall: they do change with m - n
    # Control: an absolute position signal added to q breaks diagonal constancy.
    torch.manual_seed(0)
    q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    positions = torch.arange(64)
    absolute = (rotate(q.expand(64, 64), positions, 1e4) + 0.1 * positions[:, None]) @ rotate(k.expand(64, 64), positions, 1e4).T
    assert max(float(torch.diagonal(absolute, o).max() - torch.diagonal(absolute, o).min()) for o in range(-63, 64)) > 1e-2


def test_matrix_complex_and_elementwise_forms_agree():
    worst = equivalences(64, 1e4)
    assert max(worst.values()) < 1e-12
    # Control: the half-split layout without the dimension permutation is a different rotation.
    q = torch.randn(64, dtype=torch.float64)
    assert (rotate(q[None], torch.tensor([5]), 1e4, "half") - rotate(q[None], torch.tensor([5]), 1e4, "interleaved")).abs().max() > 1e-3


def test_long_term_decay_bound():
    distances = torch.arange(0, 4097)
    small_base, large_base = abel_bound(64, 1e4, distances), abel_bound(64, 1e6, distances)
    assert math.isclose(small_base[0].item(), (32 + 1) / 2)  # at r = 0, |S_j| = j
    assert small_base[1000:].mean() < 0.35 * small_base[0]  # it decays
    assert large_base[10:1000].mean() > small_base[10:1000].mean()  # a larger base decays more slowly


def test_frequency_map_matches_the_scalings():
    waves = frequency_map(64, 1e4, 256, 4.0)
    low, high = yarn_correction_range(64, 1e4, {"factor": 4.0, "original_max_position_embeddings": 256})
    ramp = waves["ramp"]
    assert int((ramp == 0).sum()) == low + 1 and int((ramp == 1).sum()) == 32 - high
    assert torch.allclose(waves["linear"], 4 * waves["default"], rtol=1e-6)
    assert math.isclose(float(waves["ntk"][-1] / waves["default"][-1]), 4.0, rel_tol=1e-5)
    assert math.isclose(float(waves["ntk"][0] / waves["default"][0]), 1.0, rel_tol=1e-6)
    kept = ramp == 0
    assert torch.allclose(waves["yarn"][kept], waves["default"][kept])  # YaRN leaves high frequencies alone
    assert torch.all(waves["default"][ramp == 1] > 256)  # and interpolates only wavelengths beyond L


def test_single_low_frequency_neighbours_need_float64():
    table = precision(64, 1e4, period=1e6, max_offset=200)
    single32, single64 = table["single low frequency, float32"], table["single low frequency, float64"]
    assert single32["score(0) - score(1)"] == 0.0  # indistinguishable in float32
    assert math.isclose(single64["score(0) - score(1)"], 1 - math.cos(2 * math.pi / 1e6), rel_tol=1e-3)  # ~2e-11
    assert single32["identical neighbours"] > 100 and single64["identical neighbours"] == 0
    assert table["multi-frequency RoPE, float32"]["identical neighbours"] == 0


def test_rope_in_linear_attention_stays_relative():
    result = linear_attention_check()
    assert result["shift_diff"] < 1e-9
    assert result["prefix_sum_vs_quadratic"] < 1e-12


def test_command_writes_summary_and_figures(tmp_path):
    assert main(["--out", str(tmp_path), "--head-dim", "32", "--length", "128"]) == 0
    summary = (tmp_path / "summary.md").read_text()
    for figure in ("relative.png", "decay.png", "frequency_map.png", "precision.png"):
        assert (tmp_path / figure).stat().st_size > 5000 and f"({figure})" in summary
    assert "猫追老鼠" in summary and "| single low frequency, float32 | 0.000e+00 |" in summary
