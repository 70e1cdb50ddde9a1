"""Chunked attention (model.attention_chunk, Llama 4's): a query sees the keys of its own chunk of C tokens, up to
itself. Invariant: with every layer chunked, an encoding that reads only relative positions gives each chunk's
tokens the logits of that chunk scored alone; cached decoding equals a full forward with both caches; the backends
serve it at 16x; settings it cannot take are refused by name."""
import pytest
import torch

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from tests.conftest import decode_in_steps, micro_config

CHUNK = 12


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "none", "cope", "fox"])
def test_each_chunk_is_scored_as_if_alone(position):
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, attention_chunk=[CHUNK])).eval()
    idx = torch.randint(0, 97, (2, 4 * CHUNK + 5))  # the last chunk is partial
    with torch.no_grad():
        whole = model(idx)[0]
        for start in range(0, idx.shape[1], CHUNK):
            alone = model(idx[:, start:start + CHUNK])[0]
            assert (whole[:, start:start + CHUNK] - alone).abs().max() < 1e-4, (position, start)
        unchunked = Transformer(micro_config(position=position))
        unchunked.load_state_dict(model.state_dict())
        assert (unchunked.eval()(idx)[0] - whole)[:, CHUNK:].abs().max() > 1e-3  # the chunks matter: it can fail


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_equals_a_full_forward(position, cache_type):
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, attention_chunk=[CHUNK, 0])).eval()  # a chunked and a global layer
    idx = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        full = model(idx)[0]
        steps = decode_in_steps(model, idx, (7,), cache_type.for_model(model.config, 2, 48))
    assert (steps - full).abs().max() < 1e-4


def test_sixteen_times_the_trained_length_takes_the_chunked_backends():
    model = Transformer(micro_config(position="rope", attention_chunk=[CHUNK, 0], max_seq_len=32)).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, 97, (1, 16 * 32)))[0]
    assert torch.isfinite(logits).all()
    paths = list(model.attention_paths().values())
    assert paths[0].startswith("sdpa_mask: an attention chunk") and paths[1].startswith("sdpa:")
    alibi = Transformer(micro_config(position="alibi", attention_chunk=[CHUNK], max_seq_len=32)).eval()
    with torch.no_grad():
        alibi(torch.randint(0, 97, (1, 16 * 32)))
    assert all("an attention chunk, which its block masks do not draw" in path
               for path in alibi.attention_paths().values())


def test_what_it_cannot_take_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"attention_window and model.attention_chunk both limit layer\(s\) \[0\]"):
        micro_config(attention_window=[8, 0], attention_chunk=[8, 0])
    with pytest.raises(ConfigError, match="attention_chunk must hold integers >= 0"):
        micro_config(attention_chunk=[-1])
    with pytest.raises(ConfigError, match="attention_chunk has 3 entries"):
        micro_config(attention_chunk=[8, 8, 0])
    for position in ("ssmax", "asentmax"):
        with pytest.raises(ConfigError, match=f"{position} scales each query by the log of the keys it sees"):
            micro_config(position=position, attention_chunk=[8])
    micro_config(attention_window=[8, 0], attention_chunk=[0, 8])  # a window in one layer, a chunk in the other
