"""RoPE: layouts, relative-position property, and parity with transformers' Llama."""
import pytest
import torch

from model import Transformer
from model.rope import apply_rope, default_inv_freq, rope_cos_sin
from tests.conftest import micro_config


def rotated_scores(q, k, positions, layout, head_dim=None):
    inv_freq = default_inv_freq(q.shape[-1], 10000.0)
    cos, sin = rope_cos_sin(inv_freq, positions, layout)
    return apply_rope(q, cos, sin, layout) @ apply_rope(k, cos, sin, layout).transpose(-1, -2)


def test_half_and_interleaved_layouts_agree_after_permutation():
    """Pairs (2i, 2i+1) in the interleaved layout are pairs (i, i + d/2) in the half layout."""
    head_dim, time = 32, 24
    q = torch.randn(1, 2, time, head_dim, dtype=torch.float64)
    k = torch.randn(1, 2, time, head_dim, dtype=torch.float64)
    positions = torch.arange(time)[None]
    permutation = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    interleaved = rotated_scores(q, k, positions, "interleaved")
    half = rotated_scores(q[..., permutation], k[..., permutation], positions, "half")
    assert (interleaved - half).abs().max() < 1e-9
    # Without the permutation the layouts differ: the test can tell them apart.
    assert (interleaved - rotated_scores(q, k, positions, "half")).abs().max() > 1e-3


def test_model_layouts_agree_after_permuting_qk_weights():
    config_i = micro_config(rope_layout="interleaved")
    config_h = micro_config(rope_layout="half")
    model_i = Transformer(config_i).eval()
    model_h = Transformer(config_h).eval()
    model_h.load_state_dict(model_i.state_dict())
    head_dim = config_i.head_dim
    permutation = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    with torch.no_grad():
        for layer in model_h.layers:
            for proj in (layer.attention.q_proj, layer.attention.k_proj):
                weight = proj.weight.view(-1, head_dim, config_h.dim)
                proj.weight.copy_(weight[:, permutation].reshape(-1, config_h.dim))
    idx = torch.randint(0, config_i.vocab_size, (2, 16))
    assert (model_i(idx)[0] - model_h(idx)[0]).abs().max() < 1e-5


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_scores_depend_only_on_position_offset(layout):
    """q_m . k_n after rotation equals q_{m+s} . k_{n+s} for the same vectors, for any shift s.

    The phases are float32 by design, so the tolerance is float32 rounding on scores of size ~|q||k|."""
    head_dim = 64
    q = torch.randn(1, 1, 1, head_dim, dtype=torch.float64).expand(1, 1, 50, head_dim)
    k = torch.randn(1, 1, 1, head_dim, dtype=torch.float64).expand(1, 1, 50, head_dim)
    scores = rotated_scores(q, k, torch.arange(50)[None], layout)[0, 0]
    for offset in range(-10, 11):
        diagonal = torch.diagonal(scores, offset=offset)
        assert (diagonal - diagonal[0]).abs().max() < 2e-5
    shifted = rotated_scores(q, k, torch.arange(1000, 1050)[None], layout)[0, 0]
    assert (shifted - scores).abs().max() < 1e-3
    assert scores.std() > 0.1  # and the scores do change with the offset


def test_cos_sin_are_float32_under_bf16_autocast():
    inv_freq = default_inv_freq(64, 10000.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, sin = rope_cos_sin(inv_freq, torch.tensor([[0, 100_000, 100_001]]), "half")
    assert cos.dtype == torch.float32
    assert not torch.equal(cos[0, 1], cos[0, 2])


def test_explicit_positions_matter_and_a_uniform_shift_does_not():
    """(Logit parity with transformers' Llama, also at explicit positions, is tests/test_hf.py's.)"""
    config = micro_config(rope_theta=500.0)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 24))
    with torch.no_grad():
        ours = model(idx)[0]
        ours_far = model(idx, positions=(100 + 3 * torch.arange(24))[None].expand(2, -1))[0]
        shifted = model(idx, positions=torch.arange(500, 524)[None])[0]
    assert (ours - ours_far).abs().max() > 1e-3
    # A uniform shift of all positions changes nothing: RoPE is relative.
    assert (ours - shifted).abs().max() < 1e-4

def textbook_rope(x, cos, sin, layout):
    """x * cos + rotate(x) * sin with the rotated copy built: transformers' rotate_half, or Meta's pairs."""
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return x * cos + rotated * sin


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_apply_rope_is_bitwise_the_textbook_formula(layout, dtype):
    """apply_rope computes each half (or pair) without building the rotated copy: the same products and sums, so
    the same bits, also with tables whose halves differ (xPos scales) and broadcast over batch and heads."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 50, 16, dtype=dtype) * 10
    cos, sin = torch.randn(2, 1, 1, 50, 16, dtype=dtype)
    assert torch.equal(apply_rope(x, cos, sin, layout), textbook_rope(x, cos, sin, layout))
    # bfloat16 inputs are rotated in float32 and returned in bfloat16
    low = x.to(torch.bfloat16)
    expected = textbook_rope(low.float(), cos.float(), sin.float(), layout).to(torch.bfloat16)
    assert torch.equal(apply_rope(low, cos.float(), sin.float(), layout), expected)
    # the other layout's formula differs: the comparison can fail
    other = "interleaved" if layout == "half" else "half"
    assert not torch.allclose(apply_rope(x, cos, sin, layout), textbook_rope(x, cos, sin, other))
