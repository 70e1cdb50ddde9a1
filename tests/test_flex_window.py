"""The flex_window backend (model/attention/flex_window.py), a backend added as one file: a layer's sliding window
through FlexAttention's block mask gives the chunked SDPA backend's logits, serves what it declares, and hands the
rest to its fallback."""
import pytest
import torch

from model import KVCache, Transformer
from tests.conftest import micro_config

LENGTH = 300  # not a multiple of FlexAttention's 128-token blocks


def windowed(window: int = 40, **settings) -> Transformer:
    """RoPE with a sliding window in every other layer (RNoPE-SWA's local layers without the NoPE)."""
    return Transformer(micro_config(position="rope", attention_window=[window, 0], **settings)).eval()


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_it_gives_the_chunked_backends_logits_and_the_window_matters(n_kv_heads):
    model = windowed(n_kv_heads=n_kv_heads)
    idx = torch.randint(0, 97, (2, LENGTH))
    fast = model.with_settings(attention_backend="flex_window")
    with torch.no_grad():
        for positions in (None, torch.arange(37, 37 + LENGTH)[None, :]):
            reference = model(idx, positions=positions)[0]
            assert (fast(idx, positions=positions)[0] - reference).abs().max() < 1e-5
    paths = list(fast.attention_paths().values())
    assert paths[0].startswith("flex_window:") and paths[1].startswith("sdpa:")  # the global layer: no window
    assert "no sliding window in this layer" in paths[1]
    with torch.no_grad():  # a wider window changes the logits: the comparison above can fail
        assert (windowed(window=80, n_kv_heads=n_kv_heads)(idx)[0] - reference).abs().max() > 1e-3


def test_training_decoding_and_bias_encodings_take_the_rules_choice():
    model = windowed().with_settings(attention_backend="flex_window")
    idx = torch.randint(0, 97, (1, 64))
    model.train()
    model(idx, targets=idx)  # gradients on the CPU: no FlexAttention backward
    assert list(model.attention_paths().values())[0].startswith("sdpa_mask:")
    model.eval()
    cache = KVCache.for_model(model.config, batch_size=1, max_len=64)
    with torch.no_grad():
        model(idx[:, :10], kv_cache=cache)
    assert "a KV cache" in list(model.attention_paths().values())[0]
    alibi = Transformer(micro_config(position="alibi", attention_window=[16],
                                     attention_backend="flex_window")).eval()
    with torch.no_grad():
        alibi(idx)
    assert all("the encoding adds to the scores" in path for path in alibi.attention_paths().values())
