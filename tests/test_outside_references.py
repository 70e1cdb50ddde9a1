"""Golden values from outside reference implementations: the encodings' authors' code where it runs on a CPU, a
published package otherwise. Each reference was run as it is, once, on fixed inputs, in a script outside this
repository; its inputs, any weights and its outputs are the fixtures tests/fixtures/<name>_reference/reference.npz,
and tests/fixtures/README.md says what ran and how. Here the encodings get the same weights and inputs, through
their public hooks or one attention layer of the model, and must give the same numbers. The references run in
float32, so the tolerances are float32's (1e-5 absolute on values of order 1)."""

import numpy as np
import pytest
import torch

from model import Transformer
from tests.conftest import ROOT, micro_config

TOLERANCE = 1e-5


def fixture(name: str) -> dict[str, torch.Tensor]:
    with np.load(ROOT / "tests" / "fixtures" / f"{name}_reference" / "reference.npz") as saved:
        return {key: torch.from_numpy(saved[key]) for key in saved.files}


def causal(time: int) -> torch.Tensor:
    return torch.ones(time, time, dtype=torch.bool).tril()


def layer_with_weights(saved: dict[str, torch.Tensor], position: str, **overrides):
    """A one-layer model (the fixture's width: 32 for 2 heads of 16, or 64 for 2 heads of 32) whose layer has the
    fixture's q, k, v projections and the identity as its output projection, so that the layer's output is the
    heads' attention outputs side by side."""
    dim = saved["w_q"].shape[0]
    config = micro_config(position=position, dim=dim, n_heads=2, n_kv_heads=2, n_layers=1, **overrides)
    model = Transformer(config).eval()
    layer = model.layers[0].attention
    with torch.no_grad():
        for name in ("q", "k", "v"):
            getattr(layer, f"{name}_proj").weight.copy_(saved[f"w_{name}"])
        layer.o_proj.weight.copy_(torch.eye(dim))
    return model, layer


def heads_output(model, layer, x: torch.Tensor) -> torch.Tensor:
    """The layer's attention output per head, (batch, heads, time, head_dim), at positions 0..time-1."""
    batch, time, _ = x.shape
    positions = torch.arange(time)[None]
    with torch.no_grad():
        y = layer(x, model.position, model.position.prepare(positions, positions), None)
    return y.view(batch, time, layer.n_heads, layer.head_dim).transpose(1, 2)


def test_kerple_equals_the_authors_parallel_kerple_log():
    """chijames/KERPLE's ParallelKerpleLog (the log variant), which adds -p log(1 + a |m - n|) to the scores. Its
    bias_p, bias_a (heads x 1 x 1) are our r1, r2; one of each starts below the reference's eps 0.01, which both
    clamp to 0.01. Compared where a query sees the key: the reference puts distance 0 above the diagonal (its
    tril), which its mask then hides."""
    saved = fixture("kerple")
    model = Transformer(micro_config(position="kerple", n_heads=4)).eval()
    with torch.no_grad():
        model.position.r1.copy_(saved["bias_p"].flatten())
        model.position.r2.copy_(saved["bias_a"].flatten())
        positions = torch.arange(10)[None]
        bias = model.position.score_bias(None, model.position.prepare(positions, positions), 0, slice(None))
    difference = (saved["scores"] + bias - saved["out"])[..., causal(10)]
    assert difference.abs().max() < TOLERANCE
    # The fixture exercises the clamp: the bias of the unclamped values is not the reference's.
    distance = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).abs()
    unclamped = -saved["bias_p"] * torch.log1p(saved["bias_a"] * distance)
    assert (saved["scores"] + unclamped - saved["out"])[..., causal(10)].abs().max() > 1e-2


def test_fire_equals_the_public_fire_module():
    """mcleish7/arithmetic's FIRE (cramming/architectures/embeddings.py), in eval mode (positions 0..11), c = 0.35,
    init_L = 4 and L_multiplier = 1.5 (so T = 6 and queries 7..11 are normalised by their own position), an MLP
    1 -> 8 -> 3 heads. Its c, L_multiplier and init_L are our c[layer], threshold_multiplier[layer] and the
    `threshold` setting; its mlp is our mlps[layer]. The whole 12 x 12 bias, both sides of the diagonal."""
    saved = fixture("fire")
    config = micro_config(position="fire", n_heads=3, n_kv_heads=3, dim=48, n_layers=1,
                          position_args={"fire": {"mlp_width": 8, "threshold": int(saved["init_L"])}})
    model = Transformer(config).eval()
    fire = model.position
    assert fire.initial_threshold == float(saved["init_L"])
    with torch.no_grad():
        for name, parameter in fire.mlps["0"].named_parameters():
            parameter.copy_(saved[f"mlp.{name}"])
        fire.c[0] = saved["c"]
        fire.threshold_multiplier[0] = saved["L_multiplier"]
        positions = torch.arange(12)[None]
        bias = fire.score_bias(torch.zeros(1, 3, 12, 16), fire.prepare(positions, positions), 0, slice(None))
    assert bias.shape == saved["bias"].shape == (1, 3, 12, 12)
    assert (bias - saved["bias"]).abs().max() < TOLERANCE


def test_cope_equals_the_authors_context_position_attention():
    """facebookresearch/RAM's ContextPosSelfAttn (projects/cope, its default settings: gates from the keys, divide
    by sqrt(d) after adding the position logits), npos = 5 so that positions clamp, on q, k, v of one layer; its
    pos_emb (1 x head_dim x npos, shared by the heads) is our embeddings[layer]. The whole layer's attention output,
    per head."""
    saved = fixture("cope")
    model, layer = layer_with_weights(saved, "cope", position_args={"cope": {"positions": 5}})
    with torch.no_grad():
        model.position.embeddings[0] = saved["pos_emb"][0]
    out = heads_output(model, layer, saved["x"])
    assert (out - saved["out"]).abs().max() < TOLERANCE


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_xpos_equals_torchscales_xpos(layout):
    """torchscale's XPOS (the xPos authors' code), head_dim 16, scale_base 16, on the queries (downscale False) and
    keys (downscale True) of 12 positions. torchscale centres the scale's positions (n - 6 for 12 tokens), ours
    counts from 0, so our rotated query is its times zeta^(6 / gamma) per pair and our key its times
    zeta^(-6 / gamma): the logits q.k, where the factors cancel, are equal. torchscale rotates adjacent pairs
    (interleaved); the half layout is the same with the dimensions permuted."""
    saved = fixture("xpos")
    config = micro_config(position="xpos", rope_layout=layout, rope_theta=10000.0,
                          position_args={"xpos": {"scale_base": 16.0}})
    model = Transformer(config).eval()
    assert model.config.head_dim == 16
    # Their dimension j is our dimension order[j]: the same in the interleaved layout; in the half layout their
    # pair (2i, 2i + 1) is our pair (i, i + 8).
    order = torch.arange(16)
    if layout == "half":
        order = torch.stack((torch.arange(8), torch.arange(8) + 8), 1).flatten()
    q, k = torch.empty(8, 12, 16), torch.empty(8, 12, 16)
    q[..., order], k[..., order] = saved["q"], saved["k"]
    positions = torch.arange(12)[None]
    with torch.no_grad():
        state = model.position.prepare(positions, positions)
        q_rot = model.position.encode_queries(q[None], state)[0][..., order]  # back in their order
        k_rot = model.position.encode_keys(k[None], state)[0][..., order]
    scores = saved["scores"]  # up to 17 in size: the tolerance is relative to the largest
    assert ((q_rot @ k_rot.transpose(-1, -2)) - scores).abs().max() < TOLERANCE * scores.abs().max()
    # The centring, made explicit: one factor per pair, the same on both of its dimensions.
    zeta = (torch.arange(0, 16, 2) + 0.4 * 16) / (1.4 * 16)
    centre = (zeta ** (-6 / 16.0)).repeat_interleave(2)  # zeta^((n - 6) / gamma) = zeta^(n / gamma) zeta^(-6 / gamma)
    assert (q_rot * centre - saved["q_rot"]).abs().max() < TOLERANCE
    assert (k_rot / centre - saved["k_rot"]).abs().max() < TOLERANCE


@pytest.mark.parametrize("window", [0, 4])
def test_ssmax_equals_the_scalable_softmax_package(window):
    """The scalable-softmax package's ScalableSoftmax (softmax(s log n z), n the size of its input), one module per
    head with s = 0.7 and 1.3, applied to each query's scaled logits q.k / sqrt(d) over the keys it sees (n = i + 1,
    or the window's 4), then to the values. Its s per head is our s[layer, head]. The whole layer's output."""
    saved = fixture("ssmax")
    model, layer = layer_with_weights(saved, "ssmax", attention_window=[window] if window else [])
    with torch.no_grad():
        model.position.s[0] = saved["s"]
    out = heads_output(model, layer, saved["x"])
    assert (out - saved[f"out_window{window}"]).abs().max() < TOLERANCE


def test_fox_equals_the_authors_forgetting_attention_kernel():
    """zhixuan-lin/forgetting-transformer's Triton kernel (ops/forgetting_attention.py, ForgettingAttention: the
    function its forgetting_attention wraps, called with float32 q, k, v where the wrapper takes only 16-bit ones),
    run in Triton's interpreter on the CPU, sm_scale 1/sqrt(16), causal; log f = logsigmoid(fgate_proj(x)) as its
    ForgettingAttentionLayer computes it (fgate_type "full"). Its fgate_proj is our gates[layer]. The whole layer's
    attention output, per head."""
    saved = fixture("fox")
    model, layer = layer_with_weights(saved, "fox")
    with torch.no_grad():
        model.position.gates["0"].weight.copy_(saved["gate_weight"])
        model.position.gates["0"].bias.copy_(saved["gate_bias"])
    out = heads_output(model, layer, saved["x"])
    assert (out - saved["out"]).abs().max() < TOLERANCE


@pytest.mark.parametrize("heads", [6, 8])
def test_alibi_equals_x_transformers(heads):
    """x-transformers' AlibiPositionalBias: the slopes (6 heads: not a power of two, so the interleaved extra slopes)
    and the bias -m_h |j - i|, which is ours, m_h (j - i), where a query sees the key."""
    saved = fixture("alibi")
    model = Transformer(micro_config(position="alibi", n_heads=heads, n_kv_heads=heads, dim=16 * heads)).eval()
    assert (model.position.slopes - saved[f"slopes_{heads}"]).abs().max() < 1e-7
    positions = torch.arange(10)[None]
    bias = model.position.score_bias(None, model.position.prepare(positions, positions), 0, slice(None))[0]
    assert (bias - saved[f"bias_{heads}"])[..., causal(10)].abs().max() < TOLERANCE


@pytest.mark.parametrize("block", [64, 16, 5])
def test_path_equals_the_reference_naive_path_attention(block, monkeypatch):
    """fla-org/flash-linear-attention's naive_path_attn (fla/ops/path_attn/naive.py; its chunked form in blocks of
    16), on q (4 heads), k, v, w (unit rows) and beta in (0, 2) of 2 KV heads, 40 tokens, no forget gate: softmax of
    q_i^T H_i ... H_{j+1} k_j / 4 over j <= i, then v. Here the encoding's own scores (the hook the attention calls,
    for chunks of 13 query rows as the attention gives them) on the fixture's w and beta, in blocks of 64 (one), 16
    and 5 rows."""
    import model.encodings.path as path_module
    from model.encodings.path import PathState

    monkeypatch.setattr(path_module, "BLOCK", block)
    saved = fixture("path")
    q, k, v, w, beta = (saved[name].transpose(1, 2) for name in ("q", "k", "v", "w", "beta"))
    # As the attention repeats keys and values for its 4 heads, and the state holds w and beta per query head.
    k, v, w, beta = (tensor.repeat_interleave(2, 1) for tensor in (k, v, w, beta))
    encoding = Transformer(micro_config(position="path")).position
    state, time, outputs = PathState(None, None, w, beta), q.shape[2], []
    for start in range(0, time, 13):
        rows, keys = slice(start, min(time, start + 13)), slice(0, min(time, start + 13))
        scores = encoding.attention_scores(q[:, :, rows], k, state, 0, rows, keys)
        outputs.append(scores.masked_fill(~causal(time)[rows, keys], float("-inf")).softmax(-1) @ v[:, :, keys])
    assert (torch.cat(outputs, 2).transpose(1, 2) - saved["out"]).abs().max() < TOLERANCE


@pytest.mark.parametrize("alpha, name", [(1.5, "entmax15"), (2.0, "sparsemax"), (1.25, "bisect125"),
                                         (1.75, "bisect175")])
def test_asentmax_weights_equal_the_entmax_package(alpha, name):
    """The entmax package 1.3's entmax15 (exact, by sorting), sparsemax and entmax_bisect (alpha 1.25 and 1.75, its
    50 steps) on causally masked scores (-inf above the diagonal), through the encoding's attention_weights hook
    with model.position_args.asentmax.alpha set."""
    saved = fixture("asentmax")
    config = micro_config(position="asentmax", position_args={"asentmax": {"alpha": alpha}})
    encoding = Transformer(config).position
    weights = encoding.attention_weights(saved["scores"], None, 0, causal(12))
    assert (weights - saved[name]).abs().max() < TOLERANCE
    assert torch.equal(weights == 0, saved[name] == 0)  # exact zeros, and only where the package has them


def test_pope_equals_pope_pytorch():
    """pope-pytorch 0.2.1's PoPE (theta 10000) and flash_attn_with_pope (its CPU path: apply_pope_to_qk, then SDPA
    with scale 1/sqrt(d), causal) on the q, k, v of one layer, 2 heads of 32, with the phase bias set to values on
    both sides of [-2 pi, 0], which the package clamps; its bias is our phase_bias[layer]. The logits q.k of the
    polar forms (its compute_attn_similarity), and the layer's attention output per head."""
    import math

    saved = fixture("pope")
    model, layer = layer_with_weights(saved, "pope")
    assert torch.allclose(model.position.inv_freq, saved["inv_freqs"])
    with torch.no_grad():
        model.position.phase_bias["0"].copy_(saved["bias"])
    x, time = saved["x"], saved["x"].shape[1]
    out = heads_output(model, layer, x)
    assert (out - saved["out"]).abs().max() < TOLERANCE
    positions = torch.arange(time)[None]
    with torch.no_grad():
        state = model.position.for_layer(x, model.position.prepare(positions, positions), 0)
        q = layer.q_proj(x).view(2, time, 2, 32).transpose(1, 2)
        k = layer.k_proj(x).view(2, time, 2, 32).transpose(1, 2)
        logits = model.position.encode_queries(q, state) @ model.position.encode_keys(k, state).transpose(-1, -2)
    similarity = saved["similarity"]  # up to 40 in size: the tolerance is relative to the largest
    assert (logits - similarity).abs().max() < TOLERANCE * similarity.abs().max()
    # The fixture exercises the clamp: some of its biases lie outside [-2 pi, 0].
    outside = (saved["bias"] > 0) | (saved["bias"] < -2 * math.pi)
    assert outside.any() and not outside.all()


@pytest.mark.parametrize("case, length", [("short", 32), ("long", 2048)])
def test_fope_equals_the_authors_fourier_embedding(case, length):
    """The FoPE authors' FourierEmbedding (olmo/model.py, with the settings of the paper's configs) on q and k of 4
    heads of 16 at positions 0..11, trained length 32 (2 frequencies kept, both Fourier pairs) and 2048 (6 kept,
    mixed into d / 4 = 4 pairs from a stepped identity); its sin_coef, cos_coef (heads x K x O) are our
    sin_coef[layer], cos_coef[layer]."""
    from model.encodings.fope import stepped_identity

    saved = fixture("fope")
    config = micro_config(position="fope", dim=64, n_heads=4, n_kv_heads=4, n_layers=1, max_seq_len=length)
    fope = Transformer(config).eval().position
    assert torch.allclose(fope.inv_freq, saved[f"{case}_inv_freq"][0])
    with torch.no_grad():
        fope.cos_coef["0"].copy_(saved[f"{case}_cos_coef"])
        fope.sin_coef["0"].copy_(saved[f"{case}_sin_coef"])
        positions = torch.arange(12)[None]
        tables = fope.for_layer(None, fope.prepare(positions, positions), 0)
        q_rot = fope.encode_queries(saved[f"{case}_q"], tables)
        k_rot = fope.encode_keys(saved[f"{case}_k"], tables)
    assert (q_rot - saved[f"{case}_q_rot"]).abs().max() < TOLERANCE
    assert (k_rot - saved[f"{case}_k_rot"]).abs().max() < TOLERANCE
    # Their initial coefficients are our (stepped) identity plus noise of std 0.3 sqrt(2 / (fan_in + fan_out)) < 0.1.
    eye = stepped_identity(*saved[f"{case}_cos_coef"].shape[1:])
    for name in ("cos_coef", "sin_coef"):
        assert (saved[f"{case}_{name}"] - eye).abs().max() < 0.45
