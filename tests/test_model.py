"""The decoder: shapes, causality, initial loss, KV-cache decoding, batching."""
import math

import pytest
import torch

from errors import ConfigError
from model import IGNORE_INDEX, KVCache, ModelConfig, StaticKVCache, Transformer
from tests.conftest import decode_in_steps, micro_config


def test_shapes_and_parameter_count():
    config = micro_config()
    model = Transformer(config)
    idx = torch.randint(0, config.vocab_size, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, config.vocab_size)
    assert loss is None
    # Tied head: the embedding is counted once.
    assert model.lm_head.weight.data_ptr() == model.tok_embeddings.weight.data_ptr()
    d, f, kv = config.dim, config.ffn_dim, config.n_kv_heads * config.head_dim
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * f + 2 * d
    assert model.num_parameters() == config.vocab_size * d + config.n_layers * per_layer + d


def test_default_ffn_dim_follows_llama_rule():
    assert ModelConfig(dim=256).ffn_dim == 704
    assert ModelConfig(dim=512).ffn_dim == 1408


@pytest.mark.parametrize("position", ["rope", "none"])
def test_causality(position):
    """Changing token t+1 must not change the logits at positions <= t."""
    config = micro_config(position=position)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % config.vocab_size
    logits, _ = model(idx)
    logits_changed, _ = model(changed)
    assert torch.equal(logits[:, :9], logits_changed[:, :9])
    assert not torch.allclose(logits[:, 9:], logits_changed[:, 9:])


def test_initial_loss_is_ln_vocab():
    config = ModelConfig(vocab_size=4096, dim=128, n_layers=2, n_heads=4, n_kv_heads=2)
    model = Transformer(config)
    idx = torch.randint(0, config.vocab_size, (4, 64))
    targets = torch.randint(0, config.vocab_size, (4, 64))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(4096)) < 0.15


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_kv_cache_decoding_equals_full_forward(layout, n_kv_heads):
    config = micro_config(rope_layout=layout, n_kv_heads=n_kv_heads)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (2, 20))
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache.for_model(config, batch_size=2, max_len=20)
        pieces = decode_in_steps(model, idx, (7, 12), cache)
    assert cache.length == 20
    assert (pieces - full).abs().max() < 1e-4


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_kv_cache_overflow_is_a_clear_error(cache_type):
    config = micro_config()
    model = Transformer(config).eval()
    cache = cache_type.for_model(config, batch_size=1, max_len=4)
    with pytest.raises(ConfigError, match="KV cache holds 4 positions"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)


def test_batch_rows_equal_rows_alone():
    config = micro_config()
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (3, 12))
    with torch.no_grad():
        batched, _ = model(idx)
        alone = torch.cat([model(idx[i : i + 1])[0] for i in range(3)])
    assert (batched - alone).abs().max() < 1e-5


def test_loss_reductions_and_ignore_index():
    config = micro_config()
    model = Transformer(config)
    idx = torch.randint(0, config.vocab_size, (2, 8))
    targets = torch.randint(0, config.vocab_size, (2, 8))
    targets[0, :3] = IGNORE_INDEX
    _, per_token = model(idx, targets, loss_reduction="none")
    _, total = model(idx, targets, loss_reduction="sum")
    _, mean = model(idx, targets)
    assert per_token.shape == (2, 8)
    assert torch.all(per_token[0, :3] == 0)
    assert torch.allclose(per_token.sum(), total)
    assert torch.allclose(total / 13, mean)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dim=65), "divisible by model.n_heads"),
        (dict(n_heads=4, n_kv_heads=3), "multiple of model.n_kv_heads"),
        (dict(position="sinusoidall"), "valid names are"),
        (dict(rope_layout="diagonal"), "rope_layout"),
        (dict(dim=36, n_heads=4), "even head_dim"),
        (dict(vocab_size="4096"), "model.vocab_size: expected int"),
    ],
)
def test_model_config_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        micro_config(**overrides)


def test_a_view_under_other_settings_shares_the_weights_and_leaves_the_model_as_it_was():
    from tests.conftest import micro_config

    model = Transformer(micro_config(position="t5", max_seq_len=8)).eval()
    before = model.config.to_dict()
    view = model.with_settings(attention_methods=[{"method": "window", "window": 4}])
    assert view is not model and view.config.attention_methods and not model.config.attention_methods
    assert model.config.to_dict() == before and model.attention_methods == []
    assert view.position.relative_attention_bias.weight is model.position.relative_attention_bias.weight
    assert view.tok_embeddings is model.tok_embeddings and view.layers is model.layers
    assert model.with_settings(position_args=before["position_args"]) is model  # nothing changes: the model itself
    with pytest.raises(ConfigError, match="change the shape of its parameters"):
        model.with_settings(position_args={"t5": {"num_buckets": 16}})


def test_a_view_is_built_around_its_models_trunk_and_shares_every_parameter():
    """A view (another method, length or backend over the same weights) is a model built from its config around
    the trunk of the model it views: the very modules and parameters, learned position parameters included, with
    no copy of the model and no edit of its module tables."""
    import inspect

    import model.transformer as transformer

    model = Transformer(micro_config(position="t5")).eval()
    view = model.with_settings(attention_methods=[{"method": "window", "window": 4}])
    assert view is not model and view.layers is model.layers and view.lm_head is model.lm_head
    ours, theirs = dict(model.named_parameters()), dict(view.named_parameters())
    assert ours.keys() == theirs.keys() and all(ours[name] is theirs[name] for name in ours)
    assert view.position is not model.position and not view.training
    source = inspect.getsource(transformer)
    assert "copy.copy" not in source and "._modules" not in source and "._parameters" not in source
