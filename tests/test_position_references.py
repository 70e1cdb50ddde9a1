"""The newer encodings against their formulas, written as loops here, on random inputs; sliding windows; layer
hybrids' configuration. The shared battery (training, KV cache, batching, shift invariance, 16x) is in
tests/test_position.py."""

import math

import pytest
import torch

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from model.encodings.cope import cope_positions
from model.encodings.rotary import xpos_zeta
from tests.conftest import micro_config


def attention_logits(model, layer_index, x, positions):
    """The (heads, time, time) pre-softmax logits of one layer, from its projections and encoding hooks."""
    layer = model.layers[layer_index].attention
    encoding = model.encoding_of(model.config.layer_encodings[layer_index])
    state = encoding.prepare(positions, positions)
    time = x.shape[1]
    q = layer.q_proj(x).view(1, time, layer.n_heads, layer.head_dim).transpose(1, 2)
    k = layer.k_proj(x).view(1, time, layer.n_kv_heads, layer.head_dim).transpose(1, 2)
    k = k.repeat_interleave(layer.n_heads // layer.n_kv_heads, dim=1)
    q, k = encoding.encode_queries(q, state), encoding.encode_keys(k, state)
    return (q @ k.transpose(-1, -2))[0] / math.sqrt(layer.head_dim)


def heads_qkv(layer, x):
    """q, k, v of one sequence x (1, time, dim), each (heads, time, head_dim); keys and values repeated over the
    query heads they serve (grouped-query attention)."""
    time, groups = x.shape[1], layer.n_heads // layer.n_kv_heads
    q = layer.q_proj(x).view(time, layer.n_heads, layer.head_dim).transpose(0, 1)
    k, v = (proj(x).view(time, layer.n_kv_heads, layer.head_dim).transpose(0, 1).repeat_interleave(groups, 0)
            for proj in (layer.k_proj, layer.v_proj))
    return q, k, v


def test_kerple_bias_is_the_formula():
    model = Transformer(micro_config(position="kerple", n_heads=4))
    with torch.no_grad():
        model.position.r1.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
        model.position.r2.copy_(torch.tensor([0.1, 0.2, 0.7, 0.01]))
    positions = torch.arange(9)[None] * 3 + 5
    bias = model.position.score_bias(None, model.position.prepare(positions, positions), 1, slice(None))
    assert bias.shape == (1, 4, 9, 9)
    for h in range(4):
        for i in range(9):
            for j in range(9):
                r1, r2 = model.position.r1[h].item(), model.position.r2[h].item()
                expected = -r1 * math.log(1 + r2 * abs(3 * i - 3 * j))
                assert abs(bias[0, h, i, j].item() - expected) < 1e-5


def test_kerple_parameters_stay_positive_after_a_training_step(tmp_path):
    """The loop projects r1, r2 back to >= 0.01 after every optimizer step (the reference's clamp)."""
    model = Transformer(micro_config(position="kerple"))
    with torch.no_grad():
        model.position.r1.fill_(-1.0)
        model.position.r2.fill_(0.005)
    model.position.constrain_()
    assert torch.all(model.position.r1 == 0.01) and torch.all(model.position.r2 == 0.01)


def test_kerple_is_shared_by_the_layers():
    model = Transformer(micro_config(position="kerple", n_layers=3))
    assert sorted(name for name, _ in model.named_parameters() if name.startswith("position.")) == [
        "position.r1", "position.r2"]


def test_fire_bias_for_hand_set_weights_is_the_formula():
    config = micro_config(position="fire", n_heads=2, position_args={"fire": {"mlp_width": 3, "threshold": 6}})
    model = Transformer(config)
    fire = model.position
    w1, b1 = torch.tensor([[1.5], [-2.0], [0.5]]), torch.tensor([0.1, 0.3, -0.2])
    w2, b2 = torch.tensor([[1.0, -1.0, 2.0], [0.5, 0.25, -3.0]]), torch.tensor([0.05, -0.1])
    c, multiplier = 0.3, 1.5  # T = 1.5 * 6 = 9
    with torch.no_grad():
        fire.mlps["1"][0].weight.copy_(w1), fire.mlps["1"][0].bias.copy_(b1)
        fire.mlps["1"][2].weight.copy_(w2), fire.mlps["1"][2].bias.copy_(b2)
        fire.c[1] = c
        fire.threshold_multiplier[1] = multiplier
        positions = torch.arange(14)[None]
        bias = fire.score_bias(torch.zeros(1, 2, 14, 16), fire.prepare(positions, positions), 1, slice(None))
    threshold = abs(multiplier * 6)

    def psi(x):
        return math.log(abs(c * x) + 1)

    for i in range(14):
        for j in range(i + 1):
            u = psi(i - j) / (psi(max(threshold, i)) + 1e-6)
            hidden = [max(0.0, w1[n, 0].item() * u + b1[n].item()) for n in range(3)]
            for h in range(2):
                expected = sum(w2[h, n].item() * hidden[n] for n in range(3)) + b2[h].item()
                assert abs(bias[0, h, i, j].item() - expected) < 1e-5


def test_fire_past_its_threshold_normalises_by_the_query_position():
    """Below T a shift changes nothing (tests/test_position.py); past T the normaliser is the query's position, so
    the same distance maps to a smaller input: the progressive interpolation."""
    model = Transformer(micro_config(position="fire", position_args={"fire": {"threshold": 8}}))
    fire = model.position
    near, far = torch.tensor([[4, 6]]), torch.tensor([[100, 102]])
    u_near = fire.normalized_distance(fire.prepare(near, near), 0, slice(None), slice(None))
    u_far = fire.normalized_distance(fire.prepare(far, far), 0, slice(None), slice(None))
    assert u_far[0, 1, 0] < u_near[0, 1, 0]
    assert torch.allclose(u_near[0, 1, 0], torch.log(torch.tensor(1.2)) / (torch.log(torch.tensor(1.8)) + 1e-6))


def test_fire_keeps_torch_default_mlp_initialisation():
    """The reference keeps nn.Linear's default init; the model's normal(0, 0.02) would make f ~ 0."""
    model = Transformer(micro_config(position="fire", position_args={"fire": {"mlp_width": 32}}))
    first = model.position.mlps["0"][0].weight  # Linear(1, 32): U(-1, 1)
    assert first.abs().max() > 0.5 and first.abs().max() <= 1.0


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_xpos_scores_are_rope_scores_times_the_decay(layout):
    """For every pair i alone: xpos score(n, m) = rope score(n, m) * zeta_i^((n - m) / gamma)."""
    rope = Transformer(micro_config(position="rope", rope_layout=layout)).eval()
    xpos = Transformer(micro_config(position="xpos", rope_layout=layout, position_args={"xpos": {"scale_base": 20.0}})).eval()
    head_dim = rope.config.head_dim
    zeta = xpos_zeta(head_dim)
    # torchscale's XPOS: scale = (arange(0, d, 2) + 0.4 d) / (1.4 d), here d = 16, written out.
    assert torch.allclose(zeta, torch.tensor([6.4, 8.4, 10.4, 12.4, 14.4, 16.4, 18.4, 20.4]) / 22.4)
    positions = torch.tensor([[0, 3, 7, 30, 31, 64]])
    for pair in range(head_dim // 2):
        dims = [pair, pair + head_dim // 2] if layout == "half" else [2 * pair, 2 * pair + 1]
        q = torch.zeros(1, 1, 6, head_dim, dtype=torch.float64)
        k = torch.zeros(1, 1, 6, head_dim, dtype=torch.float64)
        q[..., dims] = torch.randn(1, 1, 6, 2, dtype=torch.float64)
        k[..., dims] = torch.randn(1, 1, 6, 2, dtype=torch.float64)
        scores = {}
        for name, model in (("rope", rope), ("xpos", xpos)):
            state = model.position.prepare(positions, positions)
            scores[name] = model.position.encode_queries(q, state)[0, 0] @ model.position.encode_keys(k, state)[0, 0].T
        for n in range(6):
            for m in range(6):
                distance = positions[0, n].item() - positions[0, m].item()
                expected = scores["rope"][n, m].item() * zeta[pair].item() ** (distance / 20.0)
                assert abs(scores["xpos"][n, m].item() - expected) < 1e-5 * max(1.0, abs(expected))


def test_xpos_refuses_positions_whose_scale_would_overflow():
    from errors import PositionRangeError

    model = Transformer(micro_config(position="xpos", position_args={"xpos": {"scale_base": 8.0}})).eval()
    with pytest.raises(PositionRangeError, match="position_args.xpos.scale_base"):
        model(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([[10_000, 10_001]]))


def test_cope_positions_on_a_hand_computed_example():
    """Gates of one query (key 0..3, key 4 hidden): p_j = sum of the gates from key j to the query."""
    gates = torch.tensor([[0.5, 1.0, 0.25, 0.75, 0.0]])
    assert torch.allclose(cope_positions(gates, 100), torch.tensor([[2.5, 2.0, 1.0, 0.75, 0.0]]))
    assert torch.allclose(cope_positions(gates, 1), torch.tensor([[1.0, 1.0, 1.0, 0.75, 0.0]]))


def test_cope_attention_is_the_reference_formula():
    """The layer's output equals the reference's computation written as loops: gates sigmoid(q.k/sqrt(d)),
    positions summed from j to i, e interpolated between floor and ceil, logits (q.k + q.e[p]) / sqrt(d)."""
    config = micro_config(position="cope", n_kv_heads=4, position_args={"cope": {"positions": 5}})
    model = Transformer(config).eval()
    with torch.no_grad():
        model.position.embeddings.normal_(0.0, 1.0)
    layer = model.layers[0].attention
    x = torch.randn(1, 7, config.dim)
    positions = torch.arange(7)[None]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        e = model.position.embeddings[0]  # (head_dim, npos)
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            for i in range(7):
                gates = [torch.sigmoid(q[h, i] @ k[h, j] / 4.0) for j in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(float(sum(gates[j:])), 4.0)
                    low, high = math.floor(p), math.ceil(p)
                    embedding = e[:, low] * (1 - (p - low)) + e[:, high] * (p - low)
                    logits.append((q[h, i] @ k[h, j] + q[h, i] @ embedding) / 4.0)
                weights = torch.stack(logits).softmax(0)
                z[h, i] = sum(weights[j] * v[h, j] for j in range(i + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_cope_ignores_token_positions_entirely():
    model = Transformer(micro_config(position="cope")).eval()
    with torch.no_grad():
        model.position.embeddings.normal_(0.0, 1.0)
        idx = torch.randint(0, 97, (2, 16))
        assert torch.equal(model(idx)[0], model(idx, positions=torch.arange(16)[None] * 7 + 3)[0])


@pytest.mark.parametrize("window", [0, 3])
def test_ssmax_attention_is_the_papers_formula(window):
    """Scalable-Softmax written as loops: each query's weights are softmax((s_h log n) q.k / sqrt(d)) over the n
    keys it sees (i + 1, or the window), s learned per layer and head; through a KV cache, one token at a time, the
    same."""
    config = micro_config(position="ssmax", n_kv_heads=4, attention_window=[window] if window else [])
    model = Transformer(config).eval()
    with torch.no_grad():
        model.position.s.uniform_(0.2, 1.5)
    layer = model.layers[1].attention
    x = torch.randn(1, 7, config.dim)
    positions = torch.arange(7)[None]
    with torch.no_grad():
        state = model.position.prepare(positions, positions)
        out = layer(x, model.position, state, None)
        q, k, v = heads_qkv(layer, x)
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            for i in range(7):
                seen = [j for j in range(i + 1) if not window or i - j < window]
                factor = model.position.s[1, h] * math.log(len(seen))
                weights = torch.stack([factor * (q[h, i] @ k[h, j]) / 4.0 for j in seen]).softmax(0)
                z[h, i] = sum(w * v[h, j] for w, j in zip(weights, seen))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5
    # Shifted positions count the same keys: the same output.
    with torch.no_grad():
        shifted = torch.arange(7)[None] + 100
        assert torch.allclose(layer(x, model.position, model.position.prepare(shifted, shifted), None), out,
                              atol=1e-6)


def test_fox_attention_is_the_papers_formula():
    """Forgetting Attention written as loops: f_l = sigmoid(w_h . x_l + b_h) from the layer input, the logit of key
    j <= i plus sum_{l = j+1..i} log f_l (golden values of the authors' Triton kernel, run in its interpreter:
    tests/test_outside_references.py)."""
    config = micro_config(position="fox", n_kv_heads=2)
    model = Transformer(config).eval()
    with torch.no_grad():
        for gate in model.position.gates.values():
            gate.weight.normal_(0.0, 0.3)
            gate.bias.uniform_(-1.0, 2.0)
    layer = model.layers[1].attention
    x = torch.randn(1, 7, config.dim)
    positions = torch.arange(7)[None]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        gate = model.position.gates["1"]
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            forget = [torch.sigmoid(gate.weight[h] @ x[0, t] + gate.bias[h]) for t in range(7)]
            for i in range(7):
                logits = [q[h, i] @ k[h, j] / 4.0 + sum(math.log(forget[t]) for t in range(j + 1, i + 1))
                          for j in range(i + 1)]
                weights = torch.stack(logits).softmax(0)
                z[h, i] = sum(weights[j] * v[h, j] for j in range(i + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_fox_ignores_positions_and_reads_the_content():
    model = Transformer(micro_config(position="fox")).eval()
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        for gate in model.position.gates.values():
            gate.weight.normal_(0.0, 0.3)
        assert torch.equal(model(idx)[0], model(idx, positions=torch.arange(16)[None] * 7 + 3)[0])
        state = model.position.prepare(torch.arange(16)[None], torch.arange(16)[None])
        x = torch.randn(1, 16, model.config.dim)
        one = model.position.for_layer(x, state, 0).queries_sum
        other = model.position.for_layer(torch.randn(1, 16, model.config.dim), state, 0).queries_sum
        assert (one - other).abs().max() > 1e-2  # the gates come from the content
        assert bool((one[..., 1:] <= one[..., :-1]).all())  # log f <= 0: the sums only fall


@pytest.mark.parametrize("attend_current, name", [(False, "out_earlier"), (True, "out_current")])
def test_stick_breaking_equals_the_reference_implementation(attend_current, name):
    """Golden values: the reference's naive implementation run on fixed inputs (tests/fixtures/README.md)."""
    import numpy as np

    from model.encodings.stickbreaking import stick_breaking
    from tests.conftest import ROOT

    saved = np.load(ROOT / "tests" / "fixtures" / "stickbreaking_reference" / "reference.npz")
    q, k, v = (torch.from_numpy(saved[key]) for key in ("q", "k", "v"))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    visible = torch.ones(12, 12, dtype=torch.bool).tril()
    weights = stick_breaking(scores, visible, attend_current)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 12, dtype=torch.float64), atol=1e-12)
    assert (weights @ v - torch.from_numpy(saved[name])).abs().max() < 1e-5  # the reference runs in float32


def test_stick_breaking_attention_is_the_papers_formula():
    """Written as loops through the model's attention: key j < i gets beta_ij prod_{j<k<i} (1 - beta_ik), beta =
    sigmoid(q.k / sqrt(d)), and the query's own value what no key claimed."""
    config = micro_config(position="stickbreaking", n_kv_heads=4)
    model = Transformer(config).eval()
    layer = model.layers[0].attention
    x = torch.randn(1, 7, config.dim) * 4
    positions = torch.arange(7)[None]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            for i in range(7):
                beta = [torch.sigmoid(q[h, i] @ k[h, j] / 4.0) for j in range(i)]
                left = 1.0
                for j in reversed(range(i)):  # nearest first
                    z[h, i] += beta[j] * left * v[h, j]
                    left = left * (1 - beta[j])
                z[h, i] += left * v[h, i]
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5


def test_stick_breaking_at_16x_in_bfloat16_stays_near_float64():
    """The weights in log space (cumulative log(1 - beta)) at 16x L: a bf16-autocast forward against the same
    model in float64, and the weights of bf16-rounded scores against float64 ones."""
    from model.encodings.stickbreaking import stick_breaking

    model = Transformer(micro_config(position="stickbreaking", max_seq_len=32)).eval()
    idx = torch.randint(0, 97, (1, 512))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(idx)[0].float()
    exact = Transformer(micro_config(position="stickbreaking", max_seq_len=32)).double().eval()
    exact.load_state_dict(model.state_dict())
    with torch.no_grad():
        high = exact(idx)[0]
    assert torch.isfinite(low).all() and (low.double() - high).abs().max() < 0.02
    scores = torch.randn(2, 512, 512, dtype=torch.float64) * 3
    visible = torch.ones(512, 512, dtype=torch.bool).tril()
    reference = stick_breaking(scores, visible, False)
    rounded = stick_breaking(scores.to(torch.bfloat16).float(), visible, False)
    assert torch.allclose(rounded.sum(-1), torch.ones(2, 512), atol=1e-5)  # every row still sums to 1
    assert (rounded.double() - reference).abs().max() < 0.01


def test_stick_breaking_ignores_positions():
    model = Transformer(micro_config(position="stickbreaking")).eval()
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], model(idx, positions=torch.arange(16)[None] * 7 + 3)[0])


def test_dape_equals_the_reference_implementation():
    """Golden values: the reference's AliBi_DAPE on fixed logits and MLP weights (tests/fixtures/README.md), compared
    where a query sees the key (elsewhere the reference mixes in the logits of hidden keys, which softmax drops)."""
    import numpy as np

    from tests.conftest import ROOT

    saved = np.load(ROOT / "tests" / "fixtures" / "dape_reference" / "reference.npz")
    model = Transformer(micro_config(position="dape", n_heads=4, position_args={"dape": {"mlp_width": 8}})).eval()
    mlp = model.position.mlps["0"]
    with torch.no_grad():
        for name, parameter in mlp.named_parameters():
            parameter.copy_(torch.from_numpy(saved[f"mlp.{name}"]))
    logits = torch.from_numpy(saved["logits"])
    visible = torch.ones(6, 6, dtype=torch.bool).tril()
    scores = logits.masked_fill(~visible, float("-inf"))
    positions = torch.arange(6)[None]
    with torch.no_grad():
        bias = model.position.score_bias(torch.zeros(2, 4, 6, 16), model.position.prepare(positions, positions), 0,
                                         slice(0, 6), slice(0, 6), scores)
    expected = torch.from_numpy(saved["out"])
    assert ((logits + bias) - expected)[..., visible].abs().max() < 1e-5


def test_dape_attention_is_the_papers_formula():
    """Written as loops: the logit of key j <= i is q.k / sqrt(d) + B_ij + MLP([z_i.; B_i.])_j per head, B ALiBi's
    (or KERPLE's) bias and z the heads' scaled logits."""
    for base in ("alibi", "kerple"):
        config = micro_config(position="dape", n_kv_heads=4, position_args={"dape": {"base": base}})
        model = Transformer(config).eval()
        layer = model.layers[1].attention
        x = torch.randn(1, 5, config.dim) * 3
        positions = torch.arange(5)[None]
        with torch.no_grad():
            state = model.position.prepare(positions, positions)
            out = layer(x, model.position, state, None)
            q, k, v = heads_qkv(layer, x)
            base_bias = model.position.base.score_bias(None, state, 1, slice(None))[0]  # (heads, 5, 5)
            mlp = model.position.mlps["1"]
            z = torch.zeros(4, 5, 16)
            for i in range(5):
                logits = torch.stack([torch.stack([q[h, i] @ k[h, j] / 4.0 for j in range(i + 1)]) for h in range(4)])
                adapted = torch.stack([mlp(torch.cat((logits[:, j], base_bias[:, i, j]))) for j in range(i + 1)], 1)
                weights = (logits + base_bias[:, i, : i + 1] + adapted).softmax(-1)
                for h in range(4):
                    z[h, i] = sum(weights[h, j] * v[h, j] for j in range(i + 1))
            expected = layer.o_proj(z.transpose(0, 1).reshape(1, 5, config.dim))
        assert (out - expected).abs().max() < 1e-5, base


def test_dape_mlp_bias_clip_feeds_the_mlp_the_bias_at_the_clipped_distance():
    """With mlp_bias_clip = c the MLP reads the base's bias at min(i - j, c) while the logit keeps the bias at i - j
    (a loop over query and key); a clip no distance reaches changes nothing, bit for bit."""
    for base in ("alibi", "kerple"):
        plain = Transformer(micro_config(position="dape", position_args={"dape": {"base": base}})).eval()
        clipped = Transformer(micro_config(position="dape", position_args={
            "dape": {"base": base, "mlp_bias_clip": 3}})).eval()
        unreached = Transformer(micro_config(position="dape", position_args={
            "dape": {"base": base, "mlp_bias_clip": 9}})).eval()
        clipped.load_state_dict(plain.state_dict())
        unreached.load_state_dict(plain.state_dict())
        heads, time = plain.config.n_heads, 8
        positions = torch.arange(time)[None]
        scores = torch.randn(1, heads, time, time).masked_fill(~torch.ones(time, time, dtype=torch.bool).tril(),
                                                               float("-inf"))
        q = torch.zeros(1, heads, time, plain.config.head_dim)
        with torch.no_grad():
            state = plain.position.prepare(positions, positions)
            without = plain.position.score_bias(q, state, 0, slice(0, time), scores=scores)
            assert torch.equal(unreached.position.score_bias(q, state, 0, slice(0, time), scores=scores), without)
            got = clipped.position.score_bias(q, state, 0, slice(0, time), scores=scores)
            bias = plain.position.base.score_bias(q, state, 0, slice(0, time))[0]  # (heads, time, time)
            mlp = plain.position.mlps["0"]
            for i in range(time):
                for j in range(i + 1):
                    read = bias[:, i, max(j, i - 3)]  # the bias at distance min(i - j, 3)
                    expected = bias[:, i, j] + mlp(torch.cat((scores[0, :, i, j], read)))
                    assert (got[0, :, i, j] - expected).abs().max() < 1e-5, (base, i, j)
            assert not torch.allclose(got[0, :, 7, 0], without[0, :, 7, 0])


def test_dape_refuses_a_negative_mlp_bias_clip():
    with pytest.raises(ConfigError, match="mlp_bias_clip must be >= 0"):
        Transformer(micro_config(position="dape", position_args={"dape": {"mlp_bias_clip": -1}}))


def test_ssmax_starts_as_softmax_at_the_trained_length():
    model = Transformer(micro_config(position="ssmax", max_seq_len=32))
    assert torch.allclose(model.position.s * math.log(32), torch.ones_like(model.position.s))


@pytest.mark.parametrize("variant", [{"fraction": 0.5}, {"p": 0.5}, {"fraction": 0.5, "p": 0.5}])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_non_rotated_dimensions_carry_no_position(variant, layout):
    """Scores are invariant to any positions (not only shifts) when only the non-rotated dimensions are set."""
    model = Transformer(micro_config(position="rope", rope_layout=layout, position_args={"rope": variant})).eval()
    encoding, head_dim = model.position, model.config.head_dim
    rotated = torch.zeros(head_dim, dtype=torch.bool)
    if "fraction" in variant:
        rotated[: encoding.rotary_dim] = True
    frequencies = torch.cat((encoding.inv_freq, encoding.inv_freq)) if layout == "half" \
        else encoding.inv_freq.repeat_interleave(2)
    moving = torch.zeros(head_dim, dtype=torch.bool)
    moving[: encoding.rotary_dim] = frequencies != 0
    assert 0 < int(moving.sum()) < head_dim
    q, k = torch.randn(1, 1, 5, head_dim), torch.randn(1, 1, 5, head_dim)
    q[..., moving], k[..., moving] = 0.0, 0.0
    results = []
    for positions in (torch.arange(5)[None], torch.tensor([[3, 90, 17, 400, 1000]])):
        state = encoding.prepare(positions, positions)
        results.append(encoding.encode_queries(q, state)[0, 0] @ encoding.encode_keys(k, state)[0, 0].T)
    assert torch.allclose(results[0], results[1], atol=1e-5)
    # ... while the rotated ones do carry it.
    q, k = torch.randn(1, 1, 5, head_dim), torch.randn(1, 1, 5, head_dim)
    spread = [encoding.encode_queries(q, encoding.prepare(p, p))[0, 0] @
              encoding.encode_keys(k, encoding.prepare(p, p))[0, 0].T
              for p in (torch.arange(5)[None], torch.arange(5)[None] * 3)]
    assert (spread[0] - spread[1]).abs().max() > 1e-3


def test_p_rope_keeps_the_highest_frequencies():
    model = Transformer(micro_config(position="rope", position_args={"rope": {"p": 0.25}}))  # head_dim 16: 8 frequencies, keep 2
    plain = Transformer(micro_config(position="rope"))
    assert torch.equal(model.position.inv_freq[:2], plain.position.inv_freq[:2])
    assert torch.all(model.position.inv_freq[2:] == 0)


def test_partial_rotary_matches_gpt_neox_in_transformers():
    """Our rope_fraction against transformers' GPT-NeoX rotary (rotary_pct = partial_rotary_factor)."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    model = Transformer(micro_config(position="rope", position_args={"rope": {"fraction": 0.25}}, rope_theta=500.0))
    neox = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=64, rope_parameters={
        "rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.25})
    rotary = GPTNeoXRotaryEmbedding(neox)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 16)
    positions = torch.arange(3, 12)[None].expand(2, -1)
    cos, sin = rotary(q, positions)
    theirs_q, theirs_k = apply_rotary_pos_emb(q, k, cos, sin)
    state = model.position.prepare(positions, positions)
    assert torch.allclose(model.position.encode_queries(q, state), theirs_q, atol=1e-5)
    assert torch.allclose(model.position.encode_keys(k, state), theirs_k, atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi", "cope"])
def test_a_window_hides_tokens_more_than_w_back(position):
    """With window w, the last token's output of a one-layer model does not change when tokens more than w - 1
    before it change; it does change when a token inside the window changes."""
    model = Transformer(micro_config(position=position, n_layers=1, attention_window=[4])).eval()
    idx = torch.randint(0, 97, (1, 12))
    far, near = idx.clone(), idx.clone()
    far[0, :8] = (far[0, :8] + 1) % 97  # positions 0..7: outside the window of the last token (8..11)
    near[0, 8] = (near[0, 8] + 1) % 97  # the oldest key the last token still sees
    with torch.no_grad():
        base, changed_far, changed_near = (model(x)[0][0, -1] for x in (idx, far, near))
    assert torch.equal(base, changed_far)
    assert (base - changed_near).abs().max() > 1e-4


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_window_decoding_through_a_cache_equals_the_full_forward(cache_type):
    model = Transformer(micro_config(position="rope", position_layers=["rope", "none"],
                                     attention_window=[5, 0])).eval()
    idx = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        full = model(idx)[0]
        cache = cache_type.for_model(model.config, 2, 24)
        steps = [model(idx[:, :7], kv_cache=cache)[0]]
        steps += [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(7, 20)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-4


def test_windowed_attention_computes_only_the_band(monkeypatch):
    """Each chunk of rows sees at most window + rows - 1 keys: the work is O(time x window)."""
    import model.attention.sdpa_mask as attention_module

    seen = []
    original = attention_module.F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append(k.shape[2])
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    model = Transformer(micro_config(position="rope", n_layers=1, attention_window=[8])).eval()
    with torch.no_grad():
        model(torch.randint(0, 97, (1, 256)))
    assert seen and max(seen) <= 2 * 8 - 1


def test_hybrid_keeps_the_primary_encodings_parameter_names():
    model = Transformer(micro_config(position="t5", position_layers=["t5", "fire"]))
    names = {name.split(".")[0] + "." + name.split(".")[1] for name, _ in model.named_parameters()
             if name.startswith(("position.", "layer_positions."))}
    assert names == {"position.relative_attention_bias", "layer_positions.fire"}
    assert model.config.layer_encodings == ["t5", "fire"]


@pytest.mark.parametrize("overrides, message", [
    (dict(position_layers=["rope", "none", "rope"]), "does not divide model.n_layers"),
    (dict(attention_window=[4, 0, 0]), "does not divide model.n_layers"),
    (dict(position_layers=["none", "alibi"]), "must include model.position"),
    (dict(position_layers=["rope", "sinusoidal"]), "cannot be chosen per layer"),
    (dict(position_layers=["rope", "ropey"]), "unknown encoding"),
    (dict(position_layers=["rope", 3]), "must hold encoding names"),
    (dict(attention_window=[-1]), "integers >= 0"),
    (dict(position="alibi", position_args={"rope": {"fraction": 0.5}}), "settings for \\['rope'\\], which this model "
                                                                       "does not use"),
    (dict(position="alibi", position_args={"alibi": {"slope": 0.5}}), "alibi has no settings of its own"),
    (dict(position_args={"rope": {"fractions": 0.5}}), "position_args.rope: unknown setting\\(s\\) \\['fractions'\\]"),
    (dict(position_args={"rope": {"fraction": "half"}}), "position_args.rope.fraction: expected float"),
    (dict(position_args={"rope": {"fraction": 0.01}}), "even number >= 2"),
    (dict(position_args={"rope": {"p": 1.5}}), "p in \\[0, 1\\]"),
    (dict(position="xpos", position_args={"xpos": {"scale_base": 0.0}}), "xpos.scale_base must be positive"),
    (dict(position="cope", position_args={"cope": {"positions": 1}}), "cope.positions: cope needs at least 2"),
    (dict(position="fire", position_args={"fire": {"mlp_width": 0}}), "fire needs mlp_width >= 1"),
    (dict(position="path", position_args={"path": {"rank": -1}}), "path.rank must be >= 0"),
    (dict(position="asentmax", position_args={"asentmax": {"alpha": 1.0}}), "asentmax.alpha must be in \\(1, 2\\]"),
    (dict(position="asentmax", position_args={"asentmax": {"base": "rope"}}), "asentmax.base must be one of"),
    (dict(position_args=[1]), "model.position_args: expected dict"),
    (dict(position_args={"rope": 0.5}), "a table of settings per encoding"),
])
def test_bad_layer_and_variant_settings_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        micro_config(**{"n_layers": 2, **overrides})


@pytest.mark.parametrize("variant", [dict(position=name) for name in
                                     ["rope", "xpos", "alibi", "t5", "shaw", "kerple", "fire", "cope", "none",
                                      "ssmax", "fox", "stickbreaking", "dape", "path", "asentmax",
                                      "pope", "fope", "decoupled"]]
                         + [dict(position="rope", position_layers=["rope", "fire"], attention_window=[4, 0])])
def test_a_model_cast_to_bfloat16_runs_and_keeps_float32_frequencies(variant):
    """model.to(bfloat16) (scripts.generate --dtype bfloat16) runs every encoding; RoPE's frequencies, xPos's decay
    rates and ALiBi's slopes stay float32 (a bf16 inv_freq is a phase error that grows with position)."""
    model = Transformer(micro_config(**variant)).eval()
    exact = {name: getattr(model.position, name).clone() for name in model.position.exact_buffers}
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        logits = model(torch.randint(0, 97, (2, 40)))[0]
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    for name, value in exact.items():
        kept = getattr(model.position, name)
        assert kept.dtype == torch.float32 and torch.equal(kept, value)


@pytest.mark.parametrize("layers", [["rope", "fire"], ["shaw", "none"], ["kerple", "t5"]])
def test_every_parameter_of_a_hybrid_gets_a_gradient(layers):
    """A hybrid builds per-layer tables only for the layers that use them: no parameter is left without a gradient
    (DistributedDataParallel refuses unused parameters)."""
    model = Transformer(micro_config(position=layers[0], position_layers=layers))
    idx = torch.randint(0, 97, (2, 16))
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    unused = [name for name, parameter in model.named_parameters() if parameter.grad is None]
    assert unused == []


def test_xpos_refuses_a_trained_length_whose_scale_would_overflow_and_accepts_the_limit():
    from model.encodings.rotary import xpos_position_limit

    limit = xpos_position_limit(8.0, micro_config(position="xpos").head_dim)
    assert 0 < limit < 10_000
    with pytest.raises(ConfigError, match="raise the scale base"):
        Transformer(micro_config(position="xpos", position_args={"xpos": {"scale_base": 8.0}}, max_seq_len=limit + 1))
    model = Transformer(micro_config(position="xpos", position_args={"xpos": {"scale_base": 8.0}}, max_seq_len=limit)).eval()
    assert torch.isfinite(model(torch.zeros(1, 2, dtype=torch.long), positions=torch.tensor([[0, limit]]))[0]).all()


@pytest.mark.parametrize("block, chunk_rows", [(64, 0), (3, 4)])
def test_path_attention_is_the_papers_formula(block, chunk_rows, monkeypatch):
    """PaTH written as loops through the model's attention (golden values of the reference's chunked form:
    tests/test_outside_references.py): per KV head, w_t = normalise(silu(conv_3(W_up W_down x)_t)) and beta_t =
    2 sigmoid(b . x_t + c) from the layer input, H_t = I - beta_t w_t w_t^T, and the logit of key j <= i is
    q_i^T H_i ... H_{j+1} k_j / sqrt(d), each product of matrices formed explicitly; with GQA, in one block and in
    blocks of 3 rows within attention chunks of 4 rows."""
    import model.attention.explicit as attention_module
    import model.encodings.path as path_module

    monkeypatch.setattr(path_module, "BLOCK", block)
    if chunk_rows:
        monkeypatch.setattr(attention_module, "CHUNK_ELEMENTS", 4 * 9 * chunk_rows)  # heads x keys x rows
    config = micro_config(position="path", n_kv_heads=2)
    model = Transformer(config).eval()
    transforms = model.position.transforms["1"]
    with torch.no_grad():
        for parameter in transforms.parameters():
            parameter.normal_(0.0, 0.3)
    layer = model.layers[1].attention
    x = torch.randn(1, 9, config.dim)
    positions = torch.arange(9)[None]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        inputs = [transforms.w_up.weight @ (transforms.w_down.weight @ x[0, t]) for t in range(9)]
        conv = transforms.w_conv[:, 0]  # (channels, 3): output t reads inputs t - 2, t - 1, t
        z = torch.zeros(4, 9, 16)
        for h in range(4):
            g = h // 2  # the KV head this query head reads
            transform = []
            for t in range(9):
                mixed = sum(conv[:, m] * inputs[t - 2 + m] for m in range(3) if t - 2 + m >= 0)
                w = torch.nn.functional.silu(mixed)[16 * g : 16 * (g + 1)]
                w = w / torch.sqrt(w.square().sum() + 1e-6)
                beta = 2 * torch.sigmoid(transforms.beta.weight[g] @ x[0, t] + transforms.beta.bias[g])
                transform.append(torch.eye(16) - beta * torch.outer(w, w))
            for i in range(9):
                logits = []
                for j in range(i + 1):
                    carried = k[h, j]
                    for t in range(j + 1, i + 1):  # H_{j+1} first, H_i last
                        carried = transform[t] @ carried
                    logits.append(q[h, i] @ carried / 4.0)
                weights = torch.stack(logits).softmax(0)
                z[h, i] = sum(weights[j] * v[h, j] for j in range(i + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 9, config.dim))
    assert (out - expected).abs().max() < 1e-5


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_path_through_a_cache_in_small_blocks_and_chunks_equals_the_full_forward(cache_type, monkeypatch):
    """Prefills of 13 and 7 tokens and single steps, in blocks of 2 rows within attention chunks of 3: the cache's
    keys, rewritten after each forward, are carried to its latest token."""
    import model.attention.explicit as attention_module
    import model.encodings.path as path_module

    monkeypatch.setattr(path_module, "BLOCK", 2)
    monkeypatch.setattr(attention_module, "CHUNK_ELEMENTS", 2 * 4 * 24 * 3)  # batch x heads x keys x rows
    config = micro_config(position="path", max_seq_len=24)
    model = Transformer(config).eval()
    idx = torch.randint(0, 97, (2, 24))
    cache = cache_type.for_model(config, batch_size=2, max_len=32 if cache_type is StaticKVCache else 24)
    with torch.no_grad():
        pieces = [model(idx[:, :13], kv_cache=cache)[0], model(idx[:, 13:20], kv_cache=cache)[0]]
        pieces += [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(20, 24)]
        assert (torch.cat(pieces, 1) - model(idx)[0]).abs().max() < 1e-5


def test_path_ignores_positions_and_reads_the_content():
    """Positions change nothing; w and beta come from the content, w of unit length (up to the reference's eps 1e-6
    in the norm, which shortens the small vectors of an initial model: here the weights are larger) and beta in
    (0, 2)."""
    model = Transformer(micro_config(position="path")).eval()
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        for parameter in model.position.transforms.parameters():
            parameter.normal_(0.0, 0.3)
        assert torch.equal(model(idx)[0], model(idx, positions=torch.arange(16)[None] * 7 + 3)[0])
        state = model.position.prepare(torch.arange(16)[None], torch.arange(16)[None])
        one = model.position.for_layer(torch.randn(1, 16, model.config.dim), state, 0)
        other = model.position.for_layer(torch.randn(1, 16, model.config.dim), state, 0)
        assert (one.w - other.w).abs().max() > 1e-2 and (one.beta - other.beta).abs().max() > 1e-3
        assert torch.allclose(one.w.norm(dim=-1), torch.ones(1, 4, 16), atol=1e-3)  # unit vectors
        assert bool(((one.beta > 0) & (one.beta < 2)).all())  # eigenvalues 1 - beta in (-1, 1)


def entmax_by_definition(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax from its definition: [(alpha - 1) z - tau]_+^(1 / (alpha - 1)) with tau where the weights sum to
    1, found by 100 bisection steps in float64."""
    z = (alpha - 1) * z.double()
    low, high = z.max() - 1, z.max()
    for _ in range(100):
        tau = (low + high) / 2
        if ((z - tau).clamp(min=0) ** (1 / (alpha - 1))).sum() >= 1:
            low = tau
        else:
            high = tau
    return (z - low).clamp(min=0) ** (1 / (alpha - 1))


@pytest.mark.parametrize("base, window", [("none", 0), ("none", 3), ("nape", 0)])
def test_asentmax_attention_is_the_papers_formula(base, window):
    """Adaptive-Scalable Entmax written as loops (golden values of the entmax package for the mapping alone:
    tests/test_outside_references.py): query i's weights are 1.5-entmax, by its definition, of s_i q_i.k_j / sqrt(d)
    over the n_i keys it sees (i + 1, or the window), s_i = 1 + softplus(w_beta . x_i) (log(n_i + 1))^(2 tanh(w_gamma .
    x_i)) per head; with NAPE, heads 0 and 1 unscaled with ALiBi's m_h (j - i), m = 1, 1/2. Shifted positions give the
    same output."""
    config = micro_config(position="asentmax", n_kv_heads=4, attention_window=[window] if window else [],
                          position_args={"asentmax": {"base": base}})
    model = Transformer(config).eval()
    maps = model.position.temperatures["1"]
    with torch.no_grad():
        maps["beta"].weight.normal_(0.0, 0.3)
        maps["gamma"].weight.normal_(0.0, 0.3)
    layer = model.layers[1].attention
    x = torch.randn(1, 7, config.dim) * 2
    positions = torch.arange(7)[None]
    alibi = 2 if base == "nape" else 0
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q, k, v = heads_qkv(layer, x)
        z = torch.zeros(4, 7, 16)
        sparse = 0
        for h in range(4):
            for i in range(7):
                seen = [j for j in range(i + 1) if not window or i - j < window]
                if h < alibi:
                    scale, bias = 1.0, [(j - i) / (h + 1) for j in seen]
                else:
                    beta = torch.nn.functional.softplus(maps["beta"].weight[h - alibi] @ x[0, i])
                    gamma = 2 * torch.tanh(maps["gamma"].weight[h - alibi] @ x[0, i])
                    scale, bias = 1 + beta * math.log(len(seen) + 1) ** gamma, [0.0] * len(seen)
                logits = torch.stack([scale * (q[h, i] @ k[h, j]) / 4.0 + b for j, b in zip(seen, bias)])
                weights = entmax_by_definition(logits, 1.5).float()
                sparse += int((weights == 0).sum())
                z[h, i] = sum(w * v[h, j] for w, j in zip(weights, seen))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
        shifted = torch.arange(7)[None] + 100
        moved = layer(x, model.position, model.position.prepare(shifted, shifted), None)
    assert (out - expected).abs().max() < 1e-5
    assert sparse > 0  # some keys get exactly no weight
    assert torch.allclose(moved, out, atol=1e-6)


@pytest.mark.parametrize("position", ["path", "asentmax"])
def test_path_and_asentmax_at_16x_in_bfloat16_stay_near_float64(position):
    """PaTH's triangular solves and entmax's Newton steps and closed form run in float32 under bf16 autocast: a bf16
    forward at 16x L against the same model in float64."""
    model = Transformer(micro_config(position=position, max_seq_len=32)).eval()
    idx = torch.randint(0, 97, (1, 512))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(idx)[0].float()
    exact = Transformer(micro_config(position=position, max_seq_len=32)).double().eval()
    exact.load_state_dict(model.state_dict())
    with torch.no_grad():
        high = exact(idx)[0]
    assert torch.isfinite(low).all() and (low.double() - high).abs().max() < 0.02
