"""RoPE scalings against transformers' ROPE_INIT_FUNCTIONS and closed forms; logits parity with transformers."""
import itertools
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from errors import ConfigError
from model import KVCache, ModelConfig, Transformer
from model.methods import ROPE_SCALINGS
from model.methods.yarn import yarn_attention_factor, yarn_correction_range
from model.rope import apply_rope, default_inv_freq, rope_cos_sin
from tests.conftest import micro_config

GRID = list(itertools.product([32, 64, 128], [1e4, 1e6], [2.0, 4.0, 8.0, 16.0], [128, 256, 2048, 4096], [True, False]))


def hf_inv_freq(name, head_dim, theta, factor, original, truncate, seq_len=None):
    params = {"rope_type": name, "rope_theta": theta, "factor": factor}
    if name in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = original
    if name == "yarn":
        params["truncate"] = truncate
    if name == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    config = LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=original, rope_parameters=params
    )
    return ROPE_INIT_FUNCTIONS[name](config, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("name", ["linear", "dynamic", "yarn", "llama3"])
def test_inverse_frequencies_match_transformers(name):
    for head_dim, theta, factor, original, truncate in GRID:
        params = {"factor": factor, "original_max_position_embeddings": original, "truncate": truncate}
        if name != "yarn":
            params.pop("truncate")
        if name == "linear":
            params.pop("original_max_position_embeddings")
        for seq_len in ([None, original // 2, 3 * original] if name == "dynamic" else [None]):
            ours, ours_factor = ROPE_SCALINGS[name](head_dim, theta, params, seq_len)
            theirs, their_factor = hf_inv_freq(name, head_dim, theta, factor, original, truncate, seq_len)
            relative = ((ours - theirs).abs() / theirs.abs()).max().item()
            assert relative < 1e-6, (name, head_dim, theta, factor, original, truncate, seq_len, relative)
            assert ours_factor == pytest.approx(their_factor, rel=1e-6)


def test_yarn_changes_only_low_frequencies_and_truncate_matters():
    params = {"factor": 4.0, "original_max_position_embeddings": 256}
    plain = default_inv_freq(64, 1e4)
    yarn, _ = ROPE_SCALINGS["yarn"](64, 1e4, params)
    # Pair i turns 256 * inv_freq_i / 2pi times over the original length. The ramp runs from the pair
    # that turns beta_fast = 32 times (dim 0.84 -> floor 0) to the one that turns beta_slow = 1 time
    # (dim 12.9 -> ceil 13): pair 0 is kept, pairs from 13 on are divided by the factor, the rest blend.
    assert yarn_correction_range(64, 1e4, params) == (0, 13)
    assert yarn[0] == plain[0]
    assert torch.allclose(yarn[13:], plain[13:] / 4, rtol=1e-6)
    blend = (yarn[1:13] - plain[1:13] / 4) / (plain[1:13] - plain[1:13] / 4)  # share kept, 12/13 .. 1/13
    assert torch.allclose(blend, 1 - torch.arange(1, 13) / 13, atol=1e-5)
    untruncated, _ = ROPE_SCALINGS["yarn"](64, 1e4, {**params, "truncate": False})
    assert not torch.equal(yarn, untruncated)


def test_ntk_matches_closed_form():
    for head_dim, theta, factor in itertools.product([32, 64, 128], [1e4, 1e6], [2.0, 8.0]):
        ours, attention_factor = ROPE_SCALINGS["ntk"](head_dim, theta, {"factor": factor})
        base = theta * factor ** (head_dim / (head_dim - 2))
        expected = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        assert ((ours.double() - expected).abs() / expected).max() < 1e-6
        assert attention_factor == 1.0


@pytest.mark.parametrize("factor, expected", [(2, 1.0693), (4, 1.1386), (8, 1.2079), (16, 1.2773), (32, 1.3466)])
def test_yarn_attention_factor_published_values(factor, expected):
    assert yarn_attention_factor({"factor": factor}) == pytest.approx(expected, abs=1e-4)
    assert yarn_attention_factor({"factor": factor, "attention_factor": 0.5}) == 0.5
    assert yarn_attention_factor({"factor": factor, "mscale": 1.0, "mscale_all_dim": 1.0}) == 1.0


def test_attention_factor_is_applied_exactly_once():
    """At equal positions the rotation cancels, so the score is attention_factor^2 times q.k (on q and on k once)."""
    head_dim = 32
    q, k = torch.randn(1, 1, 5, head_dim), torch.randn(1, 1, 5, head_dim)
    inv_freq, factor = ROPE_SCALINGS["yarn"](head_dim, 1e4, {"factor": 8.0, "original_max_position_embeddings": 64})
    cos, sin = rope_cos_sin(inv_freq, torch.tensor([[7, 7, 7, 7, 7]]), "half", factor)
    scores = (apply_rope(q, cos, sin, "half") * apply_rope(k, cos, sin, "half")).sum(-1)
    assert torch.allclose(scores, factor**2 * (q * k).sum(-1), rtol=1e-5)


def test_original_length_defaults_to_trained_context():
    config = ModelConfig(max_seq_len=192, rope_scaling={"rope_type": "yarn", "factor": 4})
    assert config.rope_scaling["original_max_position_embeddings"] == 192
    assert config.rope_scaling["factor"] == 4.0
    legacy = ModelConfig(max_seq_len=192, rope_scaling={"type": "linear", "factor": 2})
    assert legacy.rope_scaling == {"rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"rope_type": "yarnn", "factor": 2}, r"unknown rope scaling 'yarnn'; valid names are \['default', 'dynamic'"),
        ({"rope_type": "yarn", "factor": 0.5}, "factor >= 1"),
        ({"rope_type": "linear"}, "factor >= 1, got None"),
        ({"rope_type": "linear", "factor": 2, "beta_fast": 3}, r"unknown key\(s\) \['beta_fast'\]"),
    ],
)
def test_bad_scaling_is_a_clear_config_error(scaling, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(rope_scaling=scaling)
    with pytest.raises(ConfigError, match="applies to position = 'rope'"):
        ModelConfig(position="alibi", rope_scaling={"rope_type": "linear", "factor": 2})


def test_dynamic_cached_decoding_equals_full_forward_of_each_prefix():
    """Dynamic NTK recomputes the base from the length: each cached step must equal a fresh full forward."""
    config = micro_config(max_seq_len=8, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (1, 30))
    cache = KVCache.for_model(config, 1, 30)
    with torch.no_grad():
        steps = [model(idx[:, :5], kv_cache=cache)[0][:, -1]]
        steps += [model(idx[:, t : t + 1], kv_cache=cache)[0][:, -1] for t in range(5, 30)]
        for t, logits in zip(range(5, 31), steps):
            full = model(idx[:, :t])[0][:, -1]
            assert (logits - full).abs().max() < 1e-4, t
    # And the base really changes past the trained length (a full forward of 30 differs from the prefix).
    with torch.no_grad():
        assert (model(idx)[0][:, 9] - model(idx[:, :10])[0][:, 9]).abs().max() > 1e-4


def test_inference_time_scaling_switch():
    model = Transformer(micro_config(max_seq_len=16)).eval()
    idx = torch.randint(0, 97, (1, 40))
    plain = model(idx)[0]
    yarn = model.with_rope_scaling({"rope_type": "yarn", "factor": 4.0})
    assert yarn.config.rope_scaling["original_max_position_embeddings"] == 16 and model.config.rope_scaling is None
    scaled = yarn(idx)[0]
    assert (plain - scaled).abs().max() > 1e-3
    assert torch.equal(model(idx)[0], plain)  # the model itself is unchanged
    assert torch.equal(yarn.with_rope_scaling(None)(idx)[0], plain)
    alibi = Transformer(micro_config(position="alibi"))
    with pytest.raises(ConfigError, match="rope scaling applies to RoPE checkpoints"):
        alibi.with_rope_scaling({"rope_type": "linear", "factor": 2.0})


def test_an_extended_checkpoint_keeps_its_original_length_under_a_new_scaling():
    """A model extended from 16 to 64 tokens with YaRN x4: config.original_length is 16 (not the extended 64), an
    inference-time scaling given without an original length refers to 16, and the evaluation's yarn method at the
    extended length reproduces the model as trained (factor 64 / 16 = 4 over the same original)."""
    from model.methods import METHODS

    extended = micro_config(max_seq_len=64, rope_theta=500.0,
                            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})
    assert extended.original_length == 16 and micro_config(max_seq_len=64).original_length == 64
    model = Transformer(extended).eval()
    idx = torch.randint(0, extended.vocab_size, (1, 64))
    with torch.no_grad():
        as_trained = model(idx)[0]
        at_64 = model.under(METHODS["yarn"], 64, 64)
        assert at_64.config.rope_scaling == extended.rope_scaling
        assert torch.allclose(at_64(idx)[0], as_trained, atol=1e-6)
        at_256 = model.under(METHODS["yarn"], 256, 64)
        assert at_256.config.rope_scaling["factor"] == 16.0
        assert at_256.config.rope_scaling["original_max_position_embeddings"] == 16
    assert model.with_rope_scaling({"rope_type": "yarn", "factor": 8.0}).config.rope_scaling[
        "original_max_position_embeddings"] == 16


def test_transformers_default_is_no_scaling_in_pelab():
    """'default' (transformers' name for plain RoPE) normalises to None, the one spelling of no scaling in a config;
    the command line calls it 'none'."""
    assert ModelConfig(rope_scaling={"rope_type": "default"}).rope_scaling is None
    assert ModelConfig(rope_scaling={"type": "default"}).rope_scaling is None


def test_resonance_rounds_every_wavelength_of_yarn_to_whole_tokens():
    """The closed form (Wang et al. 2024, arXiv 2403.00071): inv_freq = 2 pi / round(2 pi / inv_freq_yarn(s)),
    computed here in float64 from the textbook frequencies; at factor 1 YaRN is plain RoPE, so it is Resonance RoPE;
    YaRN's attention factor is kept (Resonance YaRN, as the authors' LlamaYaRNScaledResonanceRotaryEmbedding)."""
    for head_dim, theta, factor, original in itertools.product([16, 32, 64], [1e4, 5e5], [1.0, 4.0, 16.0], [64, 2048]):
        params = {"factor": factor, "original_max_position_embeddings": original}
        ours, attention_factor = ROPE_SCALINGS["resonance"](head_dim, theta, params)
        yarn, yarn_factor = ROPE_SCALINGS["yarn"](head_dim, theta, params)
        expected = 2 * math.pi / torch.round(2 * math.pi / yarn.double())
        assert ((ours.double() - expected).abs() / expected).max() < 1e-5  # float32 frequencies
        assert attention_factor == yarn_factor
        if factor == 1.0:
            plain = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
            assert torch.allclose(ours.double(), 2 * math.pi / torch.round(2 * math.pi / plain), rtol=1e-6)
            assert attention_factor == 1.0 and not torch.allclose(ours.double(), plain, rtol=1e-3)
        wavelengths = 2 * math.pi / ours.double()
        assert torch.allclose(wavelengths, wavelengths.round(), atol=1e-3)


def test_resonance_repeats_each_pair_exactly_after_its_wavelength():
    """cos and sin of pair i at position n and n + lambda_i are the same (to float32's rounding of the frequency):
    no pair meets a phase past L it did not meet within one wavelength (the paper's point, for the pairs whose
    wavelength is below L); plain RoPE's pairs do not repeat."""
    params = {"factor": 1.0, "original_max_position_embeddings": 64}
    positions = torch.arange(2000)[None]
    for name, repeats in (("resonance", True), ("default", False)):
        inv_freq, _ = ROPE_SCALINGS[name](32, 1e4, params)
        cos, sin = rope_cos_sin(inv_freq, positions, "interleaved")
        for i, wavelength in enumerate(torch.round(2 * math.pi / inv_freq[:6]).long().tolist()):
            same = (cos[0, wavelength:, 2 * i] - cos[0, :-wavelength, 2 * i]).abs().max() < 1e-3 and \
                (sin[0, wavelength:, 2 * i] - sin[0, :-wavelength, 2 * i]).abs().max() < 1e-3
            assert same == repeats, (name, i, wavelength)


def test_resonance_is_an_inference_method_that_never_reuses_the_plain_cell():
    """Registered once, it is a --rope-scaling choice and an evaluation method (factor = length / L), and since it
    differs from RoPE at factor 1 the evaluation scores it at L too."""
    from model.methods import METHODS

    own = micro_config(max_seq_len=16).to_dict()
    assert not any(METHODS["resonance"].as_trained_at(own, length, 16) for length in (8, 16))
    assert METHODS["yarn"].as_trained_at(own, 16, 16)
    model = Transformer(micro_config(max_seq_len=16)).eval()
    view = model.under(METHODS["resonance"], 64, 16)
    assert view.config.rope_scaling == {"rope_type": "resonance", "factor": 4.0,
                                        "original_max_position_embeddings": 16}
    trained = Transformer(micro_config(max_seq_len=16, rope_scaling={"rope_type": "resonance", "factor": 1.0}))
    assert torch.allclose(trained.position.inv_freq,
                          ROPE_SCALINGS["resonance"](16, 1e4, {"factor": 1.0, "original_max_position_embeddings": 16})[0])


def test_a_model_with_a_scaling_deep_copies_and_pickles():
    """The scaling records a RoPE encoding holds are plain data: a model copies (scripts.bench deep-copies one) and
    pickles (worker processes) with them."""
    import copy
    import pickle

    from model.transformer import Transformer
    from tests.conftest import micro_config

    model = Transformer(micro_config(rope_scaling={"rope_type": "llama3", "factor": 2.0}))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone.position.init_fn == model.position.init_fn
        assert dict(clone.position.init_fn.defaults) == {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
