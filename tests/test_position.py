"""Every position encoding: trains, decodes with the KV cache, batches, and keeps its promises."""

import pytest
import torch

import model.attention.explicit as explicit_backend
import model.attention.sdpa_mask as masked_backend
from errors import ConfigError, PositionRangeError
from model import KVCache, StaticKVCache, Transformer
from model.attention import Attention
from model.encodings import POSITION_ENCODINGS
from model.encodings.alibi import alibi_slopes
from model.encodings.t5 import t5_bucket
from tests.conftest import micro_config

ENCODINGS = ["rope", "alibi", "t5", "shaw", "sinusoidal", "learned", "none", "fire", "kerple", "xpos", "cope",
             "ssmax", "fox", "stickbreaking", "dape", "path", "asentmax",
             "pope", "fope", "decoupled"]
# RoPE variants and layer hybrids (model.position_layers, model.attention_window) run the same battery.
HYBRIDS = [
    dict(position="rope", position_args={"rope": {"fraction": 0.5}}),  # partial rotary
    dict(position="rope", position_args={"rope": {"p": 0.75}}),  # p-RoPE
    dict(position="rope", position_layers=["rope", "none"]),  # iRoPE-style: every 2nd layer NoPE
    dict(position="rope", position_layers=["rope", "none"], attention_window=[6, 0]),  # RNoPE-SWA
    dict(position="alibi", attention_window=[5]),  # a sliding window on a bias encoding
    dict(position="kerple", position_layers=["kerple", "xpos"]),  # two learned encodings in one model
    dict(position="pope", position_layers=["pope", "none"], attention_window=[5, 0]),  # 2d-wide q, k in chunks
    dict(position="decoupled", position_layers=["decoupled", "none"], attention_window=[5, 0],
         position_args={"decoupled": {"rope_dim": 4}}),  # DeepSeek's rotary part beside NoPE layers, in chunks
    dict(position="rope", qk_norm=[True]),  # QK-norm in every layer
    dict(position="rope", position_layers=["rope", "none"], attention_window=[6, 0], qk_norm=[True, False]),  # a
    # QK-norm hybrid: windowed RoPE layers normalised, global NoPE layers not
    dict(position="rope", position_layers=["rope", "none"], attention_chunk=[8, 0]),  # Llama 4: chunked RoPE layers
    dict(position="rope", qk_norm=[True], attention_gate=[True]),  # gated attention with QK-norm (Qwen3-Next)
    dict(position="rope", sink_logits=[True], attention_window=[6, 0]),  # gpt-oss: learned sinks, banded layers
    dict(position="rope", rope_theta_layers=[10000.0, 1e6], rope_scaling={"rope_type": "yarn", "factor": 2.0},
         rope_scaling_layers=[False, True]),  # Gemma 3: per-layer theta, the scaling on the global layers only
]
# Shift-invariant too, but without distances (only the count of keys): its shift test is in
# tests/test_position_references.py.
COUNTING = [dict(position="ssmax", attention_window=[5, 0]),  # SSMax counts the keys within the window
            dict(position="rope", position_layers=["rope", "fox"]),  # FoX's gates beside RoPE (the paper's FoX+RoPE)
            dict(position="dape", position_args={"dape": {"base": "kerple"}}),  # DAPE on KERPLE's bias
            dict(position="ssmax", position_args={"ssmax": {"base": "rope"}}),  # SSMax on RoPE, as the paper
            dict(position="asentmax", position_args={"asentmax": {"base": "nape", "alpha": 1.25}},
                 attention_window=[5, 0]),  # ALiBi on half the heads, entmax by bisection, n within the window
            dict(position="path", position_args={"path": {"rank": 0, "conv": 0}}, attention_window=[5, 0])]
# Neither shift-invariant nor counting: FoPE's series of several frequencies per pair (beside RoPE layers).
MIXED_FREQUENCIES = [dict(position="fope", position_layers=["fope", "rope"])]
SCALED_ROPE = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "ntk", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 2.0},
    {"rope_type": "llama3", "factor": 2.0},
    {"rope_type": "resonance", "factor": 2.0},  # Resonance YaRN: whole-token wavelengths
]
VARIANTS = [dict(position=name) for name in ENCODINGS] + [dict(position="rope", rope_scaling=s) for s in SCALED_ROPE] \
    + HYBRIDS + COUNTING + MIXED_FREQUENCIES


def variant_id(variant):
    extras = [f"{key}={value}" for key, value in variant.items() if key not in ("position", "rope_scaling")]
    return "-".join([variant["position"], *([variant["rope_scaling"]["rope_type"]] if "rope_scaling" in variant
                                            else []), *extras]).replace(" ", "")


def test_registry_holds_every_encoding_and_unknown_names_list_them():
    assert sorted(POSITION_ENCODINGS) == sorted(ENCODINGS)
    with pytest.raises(ConfigError, match=r"valid names are \['alibi', 'asentmax', 'cope', 'dape', 'decoupled', "
                                          r"'fire', 'fope', 'fox', 'kerple', 'learned', 'none', 'path', 'pope', "
                                          r"'rope', 'shaw', 'sinusoidal', "
                                          r"'ssmax', 'stickbreaking', 't5', 'xpos'\]"):
        micro_config(position="nope")


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_tiny_model_trains_without_nan(variant):
    config = micro_config(**variant, max_seq_len=24)
    model = Transformer(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pattern = torch.arange(24) % 7 + 3  # a periodic sequence: learnable only with some notion of order
    idx = pattern[None].repeat(4, 1)
    losses = []
    for _ in range(30):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_kv_cache_steps_equal_full_forward_of_each_prefix(variant, cache_type):
    """Also for the static cache (compiled decoding): its unfilled slots (32 - t) must change nothing.
    Dynamic NTK is checked past its trained length (8) with one layer: deeper layers' cached keys come from hidden
    states computed under earlier bases (tests/test_extrapolation.py pins that difference)."""
    dynamic = variant.get("rope_scaling", {}).get("rope_type") == "dynamic"
    config = micro_config(**variant, max_seq_len=8 if dynamic else 24, n_layers=1 if dynamic else 2)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 24))
    cache = cache_type.for_model(config, batch_size=2, max_len=32 if cache_type is StaticKVCache else 24)
    assert not dynamic or model.position.frequencies(torch.arange(24))[0][-1] < model.position.inv_freq[-1]
    with torch.no_grad():
        prefill = model(idx[:, :6], kv_cache=cache)[0]
        assert (prefill - model(idx[:, :6])[0]).abs().max() < 1e-4
        chunk = model(idx[:, 6:10], kv_cache=cache)[0]  # several new tokens after a cached prefix
        assert (chunk - model(idx[:, :10])[0][:, 6:]).abs().max() < 1e-4
        for t in range(10, 24):
            step = model(idx[:, t : t + 1], kv_cache=cache)[0][:, -1]
            assert (step - model(idx[:, : t + 1])[0][:, -1]).abs().max() < 1e-4, t


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_batch_equals_rows_alone(variant):
    config = micro_config(**variant)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (3, 20))
    with torch.no_grad():
        together = model(idx)[0]
        alone = torch.cat([model(idx[i : i + 1])[0] for i in range(3)])
    assert (together - alone).abs().max() < 1e-5


# FIRE is shift-invariant while every query is below its threshold T (a query past T is normalised by its own
# position, by design): T = 4096 here, past the shifted positions.
RELATIVE = [dict(position="rope"), dict(position="alibi"), dict(position="t5"), dict(position="shaw"),
            dict(position="kerple"), dict(position="xpos"), dict(position="fire", position_args={"fire": {"threshold": 4096}}),
            dict(position="pope"), dict(position="decoupled")] + [
    dict(position="rope", rope_scaling=s) for s in SCALED_ROPE if s["rope_type"] != "dynamic"
] + [variant for variant in HYBRIDS]


@pytest.mark.parametrize("variant", RELATIVE, ids=variant_id)
def test_relative_encodings_ignore_a_shift_of_all_positions(variant):
    config = micro_config(**variant)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 16))
    with torch.no_grad():
        base = model(idx)[0]
        shifted = model(idx, positions=torch.arange(16)[None] + 1000)[0]
        spread = model(idx, positions=torch.arange(16)[None] * 2)[0]
    assert (base - shifted).abs().max() < 1e-4
    assert (base - spread).abs().max() > 1e-3  # while the relative distances do matter


@pytest.mark.parametrize("position", ["sinusoidal", "learned"])
def test_absolute_encodings_do_change_with_a_shift(position):
    args = {"learned": {"max_positions": 64}} if position == "learned" else {}
    model = Transformer(micro_config(position=position, position_args=args)).eval()
    idx = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        assert (model(idx)[0] - model(idx, positions=torch.arange(16)[None] + 20)[0]).abs().max() > 1e-3


def test_nope_without_causal_mask_is_permutation_equivariant():
    """Without positions, permuting the tokens permutes the outputs: order is invisible (猫追老鼠 = 老鼠追猫)."""
    for position in ("none", "rope"):
        config = micro_config(position=position)
        model = Transformer(config).eval()
        attention: Attention = model.layers[0].attention
        x = 10 * torch.randn(1, 10, config.dim)  # large enough that attention is far from uniform
        permutation = torch.randperm(10)
        positions = torch.arange(10)[None]
        state = model.position.prepare(positions, positions)
        with torch.no_grad():
            out = attention(x, model.position, state, None, causal=False)
            out_permuted = attention(x[:, permutation], model.position, state, None, causal=False)
        difference = (out[:, permutation] - out_permuted).abs().max()
        if position == "none":
            assert difference < 1e-5
        else:
            assert difference > 1e-3  # RoPE breaks the symmetry


def test_alibi_slopes():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence (2^-0.5, 2^-1.5, ...).
    expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))
    assert torch.allclose(alibi_slopes(16), torch.tensor([2.0 ** -((i + 1) / 2) for i in range(16)]))
    assert len(alibi_slopes(6)) == 6 and torch.all(alibi_slopes(6) > 0)


def test_alibi_bias_is_linear_in_distance():
    model = Transformer(micro_config(position="alibi"))
    positions = torch.arange(6)[None]
    state = model.position.prepare(positions, positions)
    bias = model.position.score_bias(None, state, 0, slice(None))
    slopes = alibi_slopes(4)
    assert bias.shape == (1, 4, 6, 6)
    assert torch.allclose(bias[0, :, 5, 2], -3 * slopes)


def test_t5_buckets_match_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-3000, 1)[None]
    for num_buckets, max_distance in [(32, 128), (16, 64), (64, 1024)]:
        theirs = T5Attention._relative_position_bucket(relative, bidirectional=False, num_buckets=num_buckets,
                                                       max_distance=max_distance)
        assert torch.equal(t5_bucket(relative, num_buckets, max_distance), theirs)


def test_t5_table_is_shared_across_layers():
    model = Transformer(micro_config(position="t5", n_layers=3, position_args={"t5": {"num_buckets": 8, "max_distance": 20}}))
    tables = [name for name, _ in model.named_parameters() if "relative_attention_bias" in name]
    assert tables == ["position.relative_attention_bias.weight"]
    assert model.position.relative_attention_bias.weight.shape == (8, 4)


def test_shaw_matches_direct_formula():
    """e_ij = q_i.(k_j + aK_ij)/sqrt(d), z_i = sum_j softmax(e)_ij (v_j + aV_ij), computed with loops."""
    config = micro_config(position="shaw", n_kv_heads=4, position_args={"shaw": {"max_distance": 2}})
    model = Transformer(config).eval()
    layer = model.layers[0].attention
    x = torch.randn(1, 7, config.dim)
    positions = torch.arange(7)[None]
    with torch.no_grad():
        out = layer(x, model.position, model.position.prepare(positions, positions), None)
        q = layer.q_proj(x).view(7, 4, 16).transpose(0, 1)
        k = layer.k_proj(x).view(7, 4, 16).transpose(0, 1)
        v = layer.v_proj(x).view(7, 4, 16).transpose(0, 1)
        a_k, a_v = model.position.relative_keys["0"].weight, model.position.relative_values["0"].weight
        z = torch.zeros(4, 7, 16)
        for h in range(4):
            for i in range(7):
                index = [max(-2, min(2, j - i)) + 2 for j in range(i + 1)]
                e = torch.stack([q[h, i] @ (k[h, j] + a_k[index[j]]) for j in range(i + 1)]) / 4.0
                weights = e.softmax(0)
                z[h, i] = sum(weights[j] * (v[h, j] + a_v[index[j]]) for j in range(i + 1))
        expected = layer.o_proj(z.transpose(0, 1).reshape(1, 7, config.dim))
    assert (out - expected).abs().max() < 1e-5


@pytest.mark.parametrize("position", ["alibi", "t5", "shaw"])
def test_query_chunking_gives_the_same_result(position, monkeypatch):
    model = Transformer(micro_config(position=position)).eval()
    idx = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        whole = model(idx)[0]
        for backend in (masked_backend, explicit_backend):  # 7 rows per chunk on either backend
            monkeypatch.setattr(backend, "CHUNK_ELEMENTS", 2 * 4 * 40 * 7)
        chunked = model(idx)[0]
    assert (whole - chunked).abs().max() < 1e-5


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_evaluation_at_16x_the_trained_length(variant):
    config = micro_config(**variant, max_seq_len=32)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (1, 16 * 32))
    if variant["position"] == "learned":
        with pytest.raises(PositionRangeError, match="beyond the learned table of 32 positions"):
            model(idx)
        config = micro_config(**variant, max_seq_len=32, position_args={"learned": {"clamp": True}})
        model = Transformer(config).eval()
    with torch.no_grad():
        _, loss = model(idx[:, :-1], idx[:, 1:])
        _, loss_1x = model(idx[:, :32], idx[:, 1:33])
    # Finite, and an untrained model is no worse far past its trained length than inside it.
    assert torch.isfinite(loss) and abs(loss.item() - loss_1x.item()) < 0.5


def test_learned_clamp_reuses_the_last_row():
    model = Transformer(micro_config(position="learned", max_seq_len=8, position_args={"learned": {"clamp": True}})).eval()
    x = torch.zeros(1, 3, 64)
    out = model.position.embed(x, torch.tensor([[7, 8, 50]]))
    assert torch.equal(out[0, 0], out[0, 1]) and torch.equal(out[0, 1], out[0, 2])


@pytest.mark.parametrize("name", sorted(POSITION_ENCODINGS))
def test_the_training_forward_of_every_encoding_compiles_into_one_graph(name):
    """No graph break (a data-dependent int() or .item() in a range check, say) in a training forward with a loss:
    each would split the compiled step and print dynamo's warning at the first step of every run."""
    torch._dynamo.reset()
    model = Transformer(micro_config(position=name)).train()
    idx = torch.randint(0, 97, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0, [str(b.reason)[:200] for b in explanation.break_reasons]
