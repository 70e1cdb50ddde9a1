"""PoPE and FoPE against their papers' formulas, written as loops here, on random inputs; PoPE in bf16 at 16x against
float64; FoPE's clipped frequencies. Golden values of the references: tests/test_outside_references.py; the shared
battery (training, KV caches, batching, shift, 16x, one compiled graph): tests/test_position.py."""

import math

import torch
import torch.nn.functional as F

from model import Transformer
from model.encodings.fope import kept_frequencies
from tests.conftest import micro_config
from tests.test_position_references import heads_qkv


def test_pope_attention_is_the_papers_formula():
    """Written as loops through the model's attention (4 query heads on 2 key heads): the logit of key s <= t is
    sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c - delta_hc) / sqrt(d), theta_c = 10000^(-c / d), delta
    clamped to [-2 pi, 0]."""
    config = micro_config(position="pope", n_kv_heads=2)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.position.phase_bias["1"].uniform_(-8.0, 1.0)  # some outside [-2 pi, 0]
    layer = model.layers[1].attention
    x = torch.randn(1, 7, config.dim) * 3
    positions = torch.arange(7)[None] * 3 + 2  # not 0, 1, 2: the phases read the positions
    delta = model.position.phase_bias["1"].detach().clamp(-2 * math.pi, 0)
    theta = [10000 ** (-c / 16) for c in range(16)]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            for t in range(7):
                logits = []
                for s in range(t + 1):
                    distance = (positions[0, t] - positions[0, s]).item()
                    logits.append(sum(F.softplus(q[h, t, c]) * F.softplus(k[h, s, c])
                                      * math.cos(distance * theta[c] - delta[h, c].item()) for c in range(16)) / 4.0)
                weights = torch.stack(logits).softmax(0)
                z[h, t] = sum(weights[s] * v[h, s] for s in range(t + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_pope_content_sets_no_phase():
    """The what and the where apart: a component's phase is its position's, whatever the content (any query gives
    each component a positive magnitude at the same phase: the cross product of two encodings' (cos, sin) parts is
    0, their dot product positive), where RoPE turns a pair by its content's own angle too. With every magnitude
    equal the logits are a function of the distance alone."""
    model = Transformer(micro_config(position="pope", n_layers=1)).eval()
    positions = torch.arange(6)[None]
    state = model.position.for_layer(None, model.position.prepare(positions, positions), 0)
    one = model.position.encode_queries(torch.randn(1, 4, 6, 16) * 3, state)
    other = model.position.encode_queries(torch.randn(1, 4, 6, 16) * 3, state)
    assert torch.allclose(one[..., :16] * other[..., 16:], one[..., 16:] * other[..., :16], atol=1e-6)
    assert (one[..., :16] * other[..., :16] + one[..., 16:] * other[..., 16:] > 0).all()
    same = torch.ones(1, 4, 6, 16)
    logits = model.position.encode_queries(same, state) @ model.position.encode_keys(same, state).transpose(-1, -2)
    distance = positions[0, :, None] - positions[0, None, :]
    expected = F.softplus(torch.tensor(1.0)) ** 2 * torch.cos(distance[..., None] * model.position.inv_freq).sum(-1)
    assert torch.allclose(logits[0, 0], expected, atol=1e-4)


def test_pope_at_16x_in_bfloat16_stays_near_float64():
    """softplus (a log) and cos/sin of positions up to 16 L: a bf16-autocast forward against the same model in
    float64. The phases are float32 whatever the autocast state, as RoPE's."""
    model = Transformer(micro_config(position="pope", max_seq_len=32)).eval()
    idx = torch.randint(0, 97, (1, 512))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(idx)[0].float()
    exact = Transformer(micro_config(position="pope", max_seq_len=32)).double().eval()
    exact.load_state_dict(model.state_dict())
    with torch.no_grad():
        high = exact(idx)[0]
    assert torch.isfinite(low).all() and (low.double() - high).abs().max() < 0.02
    state = model.position.prepare(torch.arange(512)[None], torch.arange(512)[None])
    assert state.queries.dtype == torch.float32


def test_fope_attention_is_the_papers_formula():
    """Written as loops through the model's attention (4 query heads on 2 key heads, trained length 64 so that 3 of
    the 8 frequencies of a 16-dimensional head are kept, mixed into min(3, 16 / 4) = 3 pairs): pair o of
    key head g at position n turns by C_o(n) = sum_k cos(omega_k n) A_gko and S_o(n) = sum_k sin(omega_k n) B_gko,
    q_o -> q_o C - q_{o+8} S, q_{o+8} -> q_{o+8} C + q_o S; the other pairs take C = S = 1."""
    config = micro_config(position="fope", n_kv_heads=2, max_seq_len=64)
    model = Transformer(config).eval()
    fope = model.position
    omega = [10000 ** (-2 * i / 16) for i in range(8) if 10000 ** (-2 * i / 16) >= 2 * math.pi / 64]
    assert len(omega) == fope.inputs == fope.outputs == 3
    layer = model.layers[0].attention
    x = torch.randn(1, 6, config.dim) * 3
    positions = torch.arange(6)[None] + 5
    with torch.no_grad():
        out = layer(x, fope, fope.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        cos_coef, sin_coef = fope.cos_coef["0"], fope.sin_coef["0"]

        def turned(vector, head, n):
            group = head // 2  # key head of query head `head`
            result = vector.clone()
            for o in range(8):
                c = sum(math.cos(omega[i] * n) * cos_coef[group, i, o] for i in range(3)) if o < 3 else 1.0
                s = sum(math.sin(omega[i] * n) * sin_coef[group, i, o] for i in range(3)) if o < 3 else 1.0
                result[o] = vector[o] * c - vector[o + 8] * s
                result[o + 8] = vector[o + 8] * c + vector[o] * s
            return result

        z = torch.zeros(4, 6, 16)
        for h in range(4):
            for t in range(6):
                query = turned(q[h, t], h, positions[0, t].item())
                logits = [query @ turned(k[h, s], h, positions[0, s].item()) / 4.0 for s in range(t + 1)]
                weights = torch.stack(logits).softmax(0)
                z[h, t] = sum(weights[s] * v[h, s] for s in range(t + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 6, config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_fope_clips_the_frequencies_below_one_period_in_the_trained_length():
    """omega >= 2 pi / L stay; the setting is written as a number (an extension keeps the same frequencies)."""
    for length in (8, 64, 1024):
        kept = kept_frequencies(16, 10000.0, length)
        assert (kept >= 2 * math.pi / length).all() and len(kept) == sum(10000 ** (-i / 8) >= 2 * math.pi / length
                                                                        for i in range(8))
    config = micro_config(position="fope", max_seq_len=64)
    assert config.position_args["fope"]["floor_length"] == 64
    longer = micro_config(position="fope", max_seq_len=1024, position_args={"fope": {"floor_length": 64}})
    assert torch.equal(Transformer(longer).position.inv_freq, Transformer(config).position.inv_freq)


def test_fope_without_noise_is_rope_on_its_kept_frequencies():
    """With the coefficients at the identity (init_gain 0) every Fourier pair is a RoPE pair of its frequency, and the
    clipped pairs a fixed map: the logits depend on the distance alone (shift-invariant), as RoPE's. With the noise
    they do not, which is why FoPE is not in the shift test of the battery."""
    idx = torch.randint(0, 97, (1, 16))
    differences = {}
    for gain in (0.0, 0.3):
        model = Transformer(micro_config(position="fope", init_std=0.2,
                                         position_args={"fope": {"init_gain": gain}})).eval()
        with torch.no_grad():
            differences[gain] = (model(idx)[0] - model(idx, positions=torch.arange(16)[None] + 1000)[0]).abs().max()
    assert differences[0.0] < 1e-4 and differences[0.3] > 1e-2


def test_fope_coefficients_are_fixed_unless_learnable_and_stay_float32():
    fixed = Transformer(micro_config(position="fope"))
    assert not any(p.requires_grad for p in fixed.position.parameters())
    learned = Transformer(micro_config(position="fope", position_args={"fope": {"learnable": True}}))
    idx = torch.randint(0, 97, (2, 12))
    learned(idx[:, :-1], idx[:, 1:])[1].backward()
    assert all(p.grad is not None for p in learned.position.parameters())
    cast = fixed.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in cast.position.parameters())
    assert torch.isfinite(cast(idx)[0]).all()


def test_a_query_scale_multiplies_popes_logits_not_its_magnitudes():
    """logn (an inference-time query scale) multiplies the logits q.k; the attention applies it to the encoded
    query, so PoPE's softplus never sees it."""
    from model.methods import build_methods, method_context

    model = Transformer(micro_config(position="pope", n_layers=1, n_kv_heads=4, init_std=0.2,
                                     attention_methods=[{"method": "logn", "base_length": 4}])).eval()
    layer, pope = model.layers[0].attention, model.position
    x = torch.randn(1, 12, model.config.dim)
    positions = torch.arange(12)[None]
    with torch.no_grad():
        state = pope.prepare(positions, positions)
        methods = method_context(build_methods(model.config), positions, positions)
        out = layer(x, pope, state, None, methods=methods)
        q, k, v = heads_qkv(layer, x)
        layer_state = pope.for_layer(x, state, 0)
        logits = pope.encode_queries(q[None], layer_state)[0] @ pope.encode_keys(k[None], layer_state)[0].transpose(-1, -2)
        factor = torch.clamp(torch.log(torch.arange(12.0) + 1) / math.log(4), min=1.0)
        scores = (factor[:, None] * logits / 4.0).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf)
        z = scores.softmax(-1) @ v
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 12, model.config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_a_query_scale_multiplies_popes_logits_in_a_methods_passes_too():
    """With sinks whose window holds every key, its pass encodes the true positions: sinks + logn must equal logn
    alone, the scale multiplying the encoded queries of the pass, not the softplus's input."""
    idx = torch.randint(0, 97, (1, 24))
    outputs = []
    for methods in ([{"method": "logn", "base_length": 4}],
                    [{"method": "sinks", "sinks": 2, "window": 40}, {"method": "logn", "base_length": 4}]):
        torch.manual_seed(0)
        model = Transformer(micro_config(position="pope", init_std=0.2, attention_methods=methods)).eval()
        with torch.no_grad():
            outputs.append(model(idx)[0])
    assert (outputs[0] - outputs[1]).abs().max() < 1e-4


def test_methods_that_reencode_relative_positions_refuse_fope():
    """FoPE's logits depend on the positions, not only their distance (relative_only is false): sinks, which moves
    the sinks' positions and keeps the recent keys' distances, is refused, as for FIRE."""
    import pytest

    from errors import ConfigError

    with pytest.raises(ConfigError, match="sinks"):
        micro_config(position="fope", attention_methods=[{"method": "sinks"}])
    assert micro_config(position="pope", attention_methods=[{"method": "sinks"}]).attention_methods
