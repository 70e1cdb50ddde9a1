"""FlexAttention for long evaluation forwards of distance biases (model/flex.py) against the chunked path, which
stays the reference: the same logits (< 1e-4, fp32) where it is taken, the chunked path wherever it does not apply
(training, a KV cache, windows, batches, biases that are not a function of i - j), and a clean fall-back if
compiling fails."""
import pytest
import torch

from model import KVCache, Transformer, flex
from model.compiled import Compiled
from tests.conftest import micro_config

LENGTH = 150  # not a multiple of flex's 128-row blocks


@pytest.fixture
def flex_calls(monkeypatch):
    """Counts the forwards of attention layers that took FlexAttention; lets short test sequences take it."""
    calls = []
    original = flex.attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(flex, "attention", counted)
    monkeypatch.setattr(flex, "MIN_LENGTH", 64)
    monkeypatch.setattr(flex, "ENABLED", True)
    return calls


def logits(model, idx, positions=None, use_flex=True):
    flex_was = flex.ENABLED
    flex.ENABLED = use_flex
    try:
        with torch.inference_mode():
            return model(idx, positions=positions)[0]
    finally:
        flex.ENABLED = flex_was


@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("position", ["alibi", "t5", "kerple"])
def test_flex_attention_gives_the_chunked_paths_logits_for_a_distance_bias(position, n_kv_heads, flex_calls):
    model = Transformer(micro_config(position=position, n_kv_heads=n_kv_heads, max_seq_len=64)).eval()
    if position == "t5":  # buckets of a trained model differ from each other; the initial table is near zero
        torch.nn.init.normal_(model.position.relative_attention_bias.weight, std=1.0)
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    for positions in (None, torch.arange(37, 37 + LENGTH)[None, :]):  # from 0, and shifted
        reference = logits(model, idx, positions, use_flex=False)
        assert not flex_calls
        fast = logits(model, idx, positions)
        assert len(flex_calls) == model.config.n_layers
        flex_calls.clear()
        assert (fast - reference).abs().max() < 1e-4
    # A wrong bias (one distance's entry off) is seen: the check can fail.
    table = flex.distance_table

    def off_by_one(*args):
        values = table(*args)
        values[:, 5] += 0.5
        return values

    flex.distance_table = off_by_one
    try:
        assert (logits(model, idx) - reference).abs().max() > 1e-3
    finally:
        flex.distance_table = table


def test_training_decoding_windows_and_other_biases_keep_the_chunked_path(flex_calls):
    idx = torch.randint(0, 97, (1, LENGTH))
    model = Transformer(micro_config(position="alibi", max_seq_len=64))
    model.train()
    with torch.enable_grad():
        model(idx, targets=idx)[1].backward()  # training: gradients
    model.eval()
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx)  # bf16 scores
    logits(model, idx[:, :40])  # shorter than MIN_LENGTH
    logits(model, idx.repeat(2, 1))  # two sequences: the chunked path shares each chunk's bias between them
    for settings in ({"position": "fire"}, {"position": "shaw"}, {"position": "cope"},
                     {"position": "alibi", "attention_window": [16]}):
        logits(Transformer(micro_config(**settings, max_seq_len=64)).eval(), idx)
    assert not flex_calls


@pytest.mark.parametrize("position", ["alibi", "t5"])
def test_cached_decoding_equals_a_full_forward_that_takes_flex(position, flex_calls):
    model = Transformer(micro_config(position=position, max_seq_len=64)).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    full = logits(model, idx)
    assert flex_calls
    flex_calls.clear()
    cache = KVCache.for_model(model.config, batch_size=1, max_len=LENGTH)
    with torch.inference_mode():
        pieces = [model(idx[:, :100], kv_cache=cache)[0]]
        pieces += [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(100, LENGTH)]
    assert not flex_calls  # a cache: the chunked path
    assert (torch.cat(pieces, dim=1) - full).abs().max() < 1e-4


def test_a_compiler_failure_warns_once_and_falls_back_to_the_chunked_path(flex_calls, monkeypatch):
    monkeypatch.setattr(flex, "_kernel", Compiled(flex._flex, "FlexAttention", "the chunked path"))

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    model = Transformer(micro_config(position="alibi", max_seq_len=64)).eval()
    idx = torch.randint(0, 97, (1, LENGTH))
    reference = logits(model, idx, use_flex=False)
    with pytest.warns(UserWarning, match="could not be compiled .*No working C"):
        fallen_back = logits(model, idx)
    assert torch.equal(fallen_back, reference)
    assert len(flex_calls) == 1  # the first layer tried; the others and later forwards do not
    assert torch.equal(logits(model, idx), reference) and len(flex_calls) == 1
