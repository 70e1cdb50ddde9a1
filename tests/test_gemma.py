"""Gemma 3's pieces in pelab's model, each against transformers' own Gemma 3 code on the same weights: Gemma's
RMSNorm, GeGLU, and whole micro models (sandwich norms, QK-norm, the embedding scale, a head width and query scale
of their own, the local/global pattern with each layer's theta and window), plain, under a RoPE scaling on the
global layers, through the KV cache; the config mapping and its refusals."""
import pytest
import torch
from transformers import Gemma3TextConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3MLP, Gemma3RMSNorm

from errors import ConfigError, ConversionError
from infer.gemma import from_gemma3_config, gemma3_config_of, gemma3_model_from, shortest_period
from infer.generate import generate_tokens
from infer.hf_convert import to_llama_config
from infer.parity import with_scaling
from model.config import ModelConfig
from model.layers import GatedFFN, RMSNorm
from model.transformer import Transformer

# The 270M model's config as transformers reads it from the GGUF file (llama.cpp's gemma3 metadata).
GEMMA3_270M = {"model_type": "gemma3_text", "tie_word_embeddings": True, "max_position_embeddings": 32768,
               "hidden_size": 640, "num_hidden_layers": 18, "intermediate_size": 2048, "num_attention_heads": 4,
               "rms_norm_eps": 1e-6, "head_dim": 256, "rope_theta": 1000000.0, "sliding_window": 512,
               "num_key_value_heads": 1, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
               "vocab_size": 262144}


def micro_gemma(**changes) -> ModelConfig:
    """Gemma-shaped and small: 6 layers, 5 local (window 5, theta 10k) to 1 global (theta 1M), a scaling and the
    attention methods on the global one (as the import sets them); heads 24 wide while dim / heads = 16; logits
    scaled by 1/sqrt(20), not 1/sqrt(24)."""
    values = dict(vocab_size=97, dim=32, n_layers=6, n_heads=2, n_kv_heads=1, ffn_dim=48, max_seq_len=32,
                  norm_eps=1e-6, rope_theta=1e6, rope_theta_layers=[1e4] * 5 + [1e6], attention_window=[5] * 5 + [0],
                  rope_scaling_layers=[False] * 5 + [True], attention_methods_layers=[False] * 5 + [True], qk_norm=[True], norm_offset=1.0, sandwich_norms=True,
                  ffn_activation="gelu_tanh", embedding_scale=32 ** 0.5, head_width=24, attention_scale_dim=20)
    return ModelConfig(**{**values, **changes})


def perturbed(config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(config).eval()
    for parameter in model.parameters():  # norms away from the identity, positions visible in the logits
        parameter.data.add_(0.2 * torch.randn_like(parameter))
    return model


def test_gemma_rmsnorm_scales_by_one_plus_its_weight_in_float32_as_transformers():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(40, 1e-6, offset=1.0), Gemma3RMSNorm(40, eps=1e-6)
    assert torch.equal(ours.weight, torch.zeros(40))  # zero: the identity gain
    weight = torch.randn(40)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    for dtype in (torch.float32, torch.bfloat16):  # the product in float32 before the cast, in both
        x = (3 * torch.randn(2, 7, 40)).to(dtype)
        assert torch.equal(ours(x), theirs(x)), dtype
    llama = RMSNorm(40, 1e-6)  # offset 0: Llama's norm, gain = weight
    llama.weight.data.copy_(1.0 + weight)
    x = torch.randn(3, 40)
    assert torch.allclose(llama(x), theirs(x), atol=1e-6)


def test_geglu_is_transformers_gemma3_mlp():
    torch.manual_seed(0)
    config = Gemma3TextConfig(hidden_size=24, intermediate_size=40, hidden_activation="gelu_pytorch_tanh")
    theirs, ours = Gemma3MLP(config), GatedFFN(24, 40, "gelu_tanh")
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 24)
    assert torch.equal(ours(x), theirs(x))
    # the tanh approximation, not the exact GELU: the two differ at this scale
    exact = theirs.down_proj(torch.nn.functional.gelu(theirs.gate_proj(x)) * theirs.up_proj(x))
    assert not torch.allclose(ours(x), exact, atol=1e-7)


def test_a_micro_gemma_has_transformers_logits_past_its_windows():
    model = perturbed(micro_gemma())
    reference = gemma3_model_from(model)
    idx = torch.randint(0, 97, (2, 40))  # 8 windows long, past max_seq_len
    with torch.no_grad():
        ours, theirs = model(idx)[0], reference(idx).logits
    assert (ours - theirs).abs().max() < 2e-5
    # each Gemma piece matters: without it the logits move far beyond that tolerance
    for change in (dict(sandwich_norms=False), dict(embedding_scale=1.0), dict(attention_scale_dim=0),
                   dict(ffn_activation="silu"), dict(attention_window=[]), dict(rope_theta_layers=[])):
        other = Transformer(micro_gemma(**change)).eval()
        other.load_state_dict(model.state_dict(), strict=False)
        with torch.no_grad():
            assert (other(idx)[0] - theirs).abs().max() > 1e-2, change


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 4.0},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}])
def test_a_scaling_reaches_the_global_layers_only_as_in_transformers(scaling):
    model = perturbed(micro_gemma())
    plain_reference = gemma3_model_from(model)
    reference = with_scaling(plain_reference, scaling)
    idx = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        scaled = model.with_rope_scaling(scaling)(idx)[0]
        assert (scaled - reference(idx).logits).abs().max() < 2e-5
        # the scaled view leaves transformers' model itself as it was (parity's later steps use it)
        assert (plain_reference(idx).logits - model(idx)[0]).abs().max() < 2e-5
        everywhere = model.with_settings(rope_scaling=model.with_rope_scaling(scaling).config.rope_scaling,
                                         rope_scaling_layers=[])(idx)[0]  # the other convention: every layer
        assert (everywhere - scaled).abs().max() > 1e-3
        assert (scaled - model(idx)[0]).abs().max() > 1e-3


def test_greedy_decoding_through_the_kv_cache_matches_transformers_generate():
    model = perturbed(micro_gemma())
    reference = gemma3_model_from(model)
    prompt = torch.randint(3, 97, (12,)).tolist()
    ours = list(generate_tokens(model, prompt, 20, temperature=0.0))  # past the windows and max_seq_len
    with torch.no_grad():
        theirs = reference.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    assert ours == theirs


def test_the_270m_config_maps_to_five_local_layers_per_global_one():
    config, trained = from_gemma3_config(GEMMA3_270M)
    assert trained == 32768 and config.max_seq_len == 32768
    assert config.attention_window == [512] * 5 + [0] and config.rope_theta_layers == [1e4] * 5 + [1e6]
    assert config.rope_scaling_layers == [False] * 5 + [True] and config.rope_scaling is None
    assert config.layer_windows.count(0) == 3 and config.head_dim == 256 and config.dim // config.n_heads == 160
    assert config.attention_scale_dim == 256 and config.norm_offset == 1.0 and config.sandwich_norms
    assert config.embedding_scale == pytest.approx(640 ** 0.5) and config.ffn_activation == "gelu_tanh"
    assert config.qk_norm == [True] and config.tie_word_embeddings
    # the mapping back gives transformers' completed config of the same file
    back = Gemma3TextConfig(**gemma3_config_of(config))
    theirs = Gemma3TextConfig(**{k: v for k, v in GEMMA3_270M.items() if k != "model_type"})
    for key in ("layer_types", "rope_parameters", "sliding_window", "query_pre_attn_scalar", "head_dim"):
        assert getattr(back, key) == getattr(theirs, key), key


def test_a_scaling_in_the_file_stays_on_the_global_layers():
    scaled = {**GEMMA3_270M, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    config, _ = from_gemma3_config(scaled)
    assert config.rope_scaling["rope_type"] == "linear" and config.rope_scaling["factor"] == 8.0
    assert config.rope_scaling_layers == [False] * 5 + [True]


@pytest.mark.parametrize("changes, message", [
    ({"final_logit_softcapping": 30.0}, "logit soft-capping"),
    ({"layer_types": ["chunked_attention"] * 18}, "layer types \\['chunked_attention'\\]"),
    ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ({"model_type": "gemma2"}, "not Gemma 3's text decoder"),
])
def test_what_pelab_cannot_express_is_refused_by_name(changes, message):
    with pytest.raises(ConversionError, match=message):
        from_gemma3_config({**GEMMA3_270M, **changes})


def test_gemma_settings_are_checked_and_not_exported_as_llama():
    with pytest.raises(ConfigError, match="ffn_activation must be one of"):
        micro_gemma(ffn_activation="relu")
    with pytest.raises(ConfigError, match="divisible by model.n_heads"):
        ModelConfig(dim=30, n_heads=4, n_kv_heads=2)
    assert ModelConfig(dim=30, n_heads=4, n_kv_heads=2, head_width=16).head_dim == 16
    plain = dict(qk_norm=[], attention_window=[], rope_theta_layers=[], rope_scaling_layers=[],
                 attention_methods_layers=[])
    for name, llama_value in (("norm_offset", 0.0), ("sandwich_norms", False), ("ffn_activation", "silu"),
                              ("embedding_scale", 1.0), ("attention_scale_dim", 0)):
        with pytest.raises(ConversionError, match=f"cannot export model.{name} = "):
            to_llama_config(micro_gemma(**plain))
        plain[name] = llama_value
    assert to_llama_config(micro_gemma(**plain))["head_dim"] == 24  # a head width of its own is Llama's too
    assert shortest_period([1, 2, 1, 2]) == [1, 2] and shortest_period([1, 1, 2]) == [1, 1, 2]


def test_an_attention_method_reaches_the_layers_it_is_set_for():
    from model.kv_cache import KVCache
    from model.methods import method_spec

    model = perturbed(micro_gemma())  # the methods on the global layer, as the import sets them
    idx = torch.randint(0, 97, (1, 40))
    method = [{"method": "rerope", "window": 3}]
    with torch.no_grad():
        plain = model(idx)[0]
        nowhere = model.with_settings(attention_methods=method, attention_methods_layers=[False])(idx)[0]
        assert torch.equal(nowhere, plain)
        global_only = model.with_settings(attention_methods=method)
        every = model.with_settings(attention_methods=method, attention_methods_layers=[])
        ours = global_only(idx)[0]
        assert (ours - plain).abs().max() > 1e-3 and (every(idx)[0] - ours).abs().max() > 1e-3
        cache = KVCache.for_model(global_only.config, batch_size=1, max_len=40)  # keys cached per layer as it needs
        steps = [global_only(idx[:, : 30], kv_cache=cache)[0][:, -1]]
        steps += [global_only(idx[:, t : t + 1], kv_cache=cache)[0][:, -1] for t in range(30, 40)]
        assert (torch.stack(steps[1:], 1) - ours[:, 30:]).abs().max() < 1e-4
    changes = method_spec("rerope@all").changes(model.config.to_dict(), 64, 32)
    assert changes["attention_methods_layers"] == [] and changes["rope_scaling_layers"] == []
    assert "attention_methods_layers" not in method_spec("rerope").changes(model.config.to_dict(), 64, 32)


def test_a_view_refuses_a_setting_its_layers_hold():
    model = Transformer(micro_gemma())
    with pytest.raises(ConfigError, match="model.attention_window is held by the layers a view shares"):
        model.with_settings(attention_window=[])
    with pytest.raises(ConfigError, match="model.sandwich_norms is held"):
        model.with_settings(sandwich_norms=False)
    assert model.with_settings(embedding_scale=2.0).config.embedding_scale == 2.0  # read at each forward: a view's
