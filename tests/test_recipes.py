"""The recipes of 2025's open models (model/recipes.py): the scaling rule keeps what it says it keeps,
the layer patterns agree with transformers' configs of those models, every recipe builds a model that trains a step
and decodes as it forwards, and compare.variants expands a recipe for the comparison's shape."""
import math

import pytest
import torch

from errors import ConfigError
from experiments.compare import Settings
from model import KVCache, Transformer
from model.config import ModelConfig
from model.methods import METHODS, applies
from model.recipes import (
    INFERENCE,
    MIN_SPAN,
    RECIPES,
    Shape,
    expand,
    longest_wavelength,
    scaled_span,
    scaled_theta,
)

SHAPE = Shape(context=64, n_layers=6, head_dim=16)


def build(name: str, shape: Shape = SHAPE) -> Transformer:
    settings = RECIPES[name](shape)
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=64, dim=shape.head_dim * 2, n_heads=2, n_kv_heads=1,
                                   n_layers=shape.n_layers, max_seq_len=shape.context, **settings))


def test_the_longest_wavelength_keeps_its_ratio_to_the_context():
    # Gemma 3's global layers: theta 1M, head width 128, 32,768 tokens; at L = 64 and head width 32
    shape = Shape(context=64, n_layers=6, head_dim=32)
    theta = scaled_theta(1e6, 128, 32768, shape)
    assert math.isclose(longest_wavelength(theta, 32) / 64, longest_wavelength(1e6, 128) / 32768, rel_tol=1e-3)
    # the formula as a loop: the slowest pair of rotate-half RoPE turns by theta^(-2i/d), i = d/2 - 1
    slowest = min(theta ** (-2 * i / 32) for i in range(16))
    assert math.isclose(2 * math.pi / slowest, longest_wavelength(theta, 32), rel_tol=1e-9)
    assert scaled_theta(1e6, 128, 32768, Shape(128, 6, 32)) > theta  # a longer context needs a larger base


def test_spans_keep_their_fraction_of_the_context_with_a_floor():
    assert scaled_span(8192, 8192, Shape(64, 6, 32)) == 64  # Llama 4: the chunk is the RoPE context
    assert scaled_span(1024, 32768, Shape(4096, 6, 32)) == 128  # Gemma 3: 1/32 of the context
    assert scaled_span(1024, 32768, Shape(64, 6, 32)) == MIN_SPAN  # 2 tokens would be no window at all


def pattern(flags):
    return [bool(flag) for flag in flags]


def test_layer_patterns_agree_with_transformers_configs_of_the_models():
    transformers = pytest.importorskip("transformers")
    shape = Shape(64, 12, 32)
    llama4 = transformers.Llama4TextConfig(num_hidden_layers=12)
    ours = RECIPES["llama4"](shape)
    assert [layer == "rope" for layer in ours["position_layers"]] == pattern(llama4.no_rope_layers)
    assert [chunk > 0 for chunk in ours["attention_chunk"]] == \
        [kind == "chunked_attention" for kind in llama4.layer_types]
    smollm3 = transformers.SmolLM3Config(num_hidden_layers=12)
    assert [layer == "rope" for layer in RECIPES["smollm3"](shape)["position_layers"]] == \
        pattern(smollm3.no_rope_layers)
    gemma3 = transformers.Gemma3TextConfig(num_hidden_layers=12)
    assert [window > 0 for window in RECIPES["gemma3"](shape)["attention_window"]] == \
        [kind == "sliding_attention" for kind in gemma3.layer_types]
    gptoss = transformers.GptOssConfig(num_hidden_layers=12)
    assert [window > 0 for window in RECIPES["gptoss"](shape)["attention_window"]] == \
        [kind == "sliding_attention" for kind in gptoss.layer_types]


def test_gemma3_refuses_a_depth_without_its_pattern():
    with pytest.raises(ConfigError, match="recipe gemma3 needs 6 layers or more.*set model.n_layers"):
        RECIPES["gemma3"](Shape(64, 4, 32))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_trains_a_step_and_decodes_as_it_forwards(name):
    model = build(name)
    idx = torch.randint(0, 64, (2, 40))
    loss = model(idx, targets=idx)[1]
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache.for_model(model.config, batch_size=2, max_len=40)
        steps = [model(idx[:, :25], kv_cache=cache)[0]] + [model(idx[:, t:t + 1], kv_cache=cache)[0]
                                                          for t in range(25, 40)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-4


def test_each_recipe_inference_method_applies_to_it():
    for name, methods in INFERENCE.items():
        model = build(name)
        for method in methods:
            assert method in METHODS
            assert applies(method, model.config.position, model.config.layer_encodings), (name, method)


def test_gemma3_scales_its_global_layers_only():
    model = build("gemma3").eval()
    view = model.under(METHODS["linear"], 256, 64)
    assert view.config.rope_scaling["factor"] == 4.0
    assert view.config.layer_rope_scaled == [False] * 5 + [True]


def test_a_variant_names_a_recipe_and_is_expanded_for_the_comparison_shape():
    shape = {"n_layers": 6, "max_seq_len": 128, "dim": 128, "n_heads": 4}
    settings = Settings(encodings=["rope", "recipe-gemma3"], variants={"recipe-gemma3": {"recipe": "gemma3"}},
                        model=shape)
    found = settings.model_settings("recipe-gemma3")
    assert found == expand({"recipe": "gemma3"}, shape)
    assert found["attention_window"] == [MIN_SPAN] * 5 + [0]
    assert settings.position_of("recipe-gemma3") == "rope"
    # the variant's own keys win over the recipe's
    assert expand({"recipe": "qwen3", "qk_norm": []}, {"n_layers": 6})["qk_norm"] == []
    with pytest.raises(ConfigError, match=r"names a recipe \(\['gated', .*'smollm3'\]\).*got \{'recipe': 'llama5'\}"):
        Settings(encodings=["x"], variants={"x": {"recipe": "llama5"}})
    with pytest.raises(ConfigError, match="sets model.position, or names a recipe"):
        Settings(encodings=["x"], variants={"x": {"recipe": "qwen3", "position": "rope"}})
