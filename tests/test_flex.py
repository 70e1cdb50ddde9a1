"""FlexAttention for long evaluation forwards of distance biases and of Shaw's clipped bias and value term
(model/attention/flex.py) against the chunked path, which stays the reference: the same logits (< 1e-4, fp32) where it is
taken, the chunked path wherever it does not apply (training, a KV cache, windows, batches, biases that are not a
function of i - j), and a clean fall-back if compiling fails."""
import pytest
import torch

import model.attention.flex as flex
from model import Transformer
from model.attention.registry import Inputs
from model.attention.sdpa_mask import Masked
from model.compiled import Compiled
from model.encodings import EXPLICIT
from tests.conftest import decode_in_steps, micro_config

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
    return calls


def logits(model, idx, positions=None, use_flex=True):
    """The model's logits, or with use_flex=False those of a view on the chunked backend the rules choose without
    FlexAttention (explicit steps where the probabilities are needed, SDPA with a mask otherwise)."""
    if not use_flex:
        model = model.with_settings(attention_backend="explicit" if model.position.attention == EXPLICIT
                                    else "sdpa_mask")
    with torch.inference_mode():
        return model(idx, positions=positions)[0]


def assert_flex_matches_the_chunked_path(model, tokens, positions, flex_calls):
    """Every layer of this forward takes FlexAttention, and its logits are the chunked path's within 1e-4."""
    reference = logits(model, tokens, positions, use_flex=False)
    assert not flex_calls
    fast = logits(model, tokens, positions)
    assert len(flex_calls) == model.config.n_layers
    flex_calls.clear()
    assert (fast - reference).abs().max() < 1e-4
    return reference


@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("position", ["alibi", "t5", "kerple"])
def test_flex_attention_gives_the_chunked_paths_logits_for_a_distance_bias(position, n_kv_heads, flex_calls):
    model = Transformer(micro_config(position=position, n_kv_heads=n_kv_heads, max_seq_len=64)).eval()
    if position == "t5":  # buckets of a trained model differ from each other; the initial table is near zero
        torch.nn.init.normal_(model.position.relative_attention_bias.weight, std=1.0)
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    for positions in (None, torch.arange(37, 37 + LENGTH)[None, :]):  # from 0, and shifted
        reference = assert_flex_matches_the_chunked_path(model, idx, positions, flex_calls)
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
    for settings in ({"position": "fire"}, {"position": "cope"}, {"position": "alibi", "attention_window": [16]},
                     {"position": "shaw", "attention_window": [16]}):
        logits(Transformer(micro_config(**settings, max_seq_len=64)).eval(), idx)
    assert not flex_calls


def shaw_model(n_kv_heads: int = 2, clip: int = 16, std: float = 1.0) -> Transformer:
    """A Shaw model whose key and value vectors are far from their initial near-zero values (a trained model's
    differ from distance to distance)."""
    model = Transformer(micro_config(position="shaw", n_kv_heads=n_kv_heads, max_seq_len=64,
                                     position_args={"shaw": {"max_distance": clip}})).eval()
    with torch.no_grad():
        for parameter in model.position.parameters():
            parameter.normal_(0.0, std)
    return model


@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("clip", [16, 3])
def test_flex_attention_gives_the_chunked_paths_logits_for_shaws_bias_and_value_term(n_kv_heads, clip, flex_calls):
    model = shaw_model(n_kv_heads, clip)
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    batch = torch.randint(0, model.config.vocab_size, (3, LENGTH))  # several sequences take it too
    for tokens, positions in ((batch, None), (idx, torch.arange(37, 37 + LENGTH)[None, :]), (idx, None)):
        reference = assert_flex_matches_the_chunked_path(model, tokens, positions, flex_calls)
    # A wrong value vector (at one near distance, or the far keys') or a wrong near bias is seen: the check can fail.
    tables = model.position.clipped_tables
    for part, distance in (("values", 2), ("values", clip), ("bias", 1)):
        def wrong(*args, part=part, distance=distance):
            bias, values = (table.clone() for table in tables(*args))
            if part == "values":
                values[distance] += 0.5
            else:
                bias[..., distance] += 0.5
            return bias, values

        model.position.clipped_tables = wrong
        try:
            assert (logits(model, idx) - reference).abs().max() > 1e-3, (part, distance)
        finally:
            model.position.clipped_tables = tables


def test_shaws_flex_path_stays_exact_when_the_bias_dominates_the_scores(flex_calls):
    """Large key vectors: the near band's logits dwarf (or, per query, fall far below) the far keys', so one part's
    softmax mass is many orders of magnitude below the other's."""
    model = shaw_model(std=6.0)
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    reference = logits(model, idx, use_flex=False)
    fast = logits(model, idx)
    assert flex_calls and torch.isfinite(fast).all()
    assert (fast - reference).abs().max() < 1e-4 * max(1.0, reference.abs().max().item())


@pytest.mark.parametrize("position", ["alibi", "t5", "shaw"])
def test_cached_decoding_equals_a_full_forward_that_takes_flex(position, flex_calls):
    model = shaw_model() if position == "shaw" else Transformer(micro_config(position=position, max_seq_len=64)).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, LENGTH))
    full = logits(model, idx)
    assert flex_calls
    flex_calls.clear()
    with torch.inference_mode():
        pieces = decode_in_steps(model, idx, (100,))
    assert not flex_calls  # a cache: the chunked path
    assert (pieces - full).abs().max() < 1e-4


@pytest.mark.parametrize("position, kernel, function", [("alibi", "_kernel", flex._flex),
                                                        ("shaw", "_far_kernel", flex._flex_far)])
def test_a_compiler_failure_warns_and_falls_back_to_the_chunked_path_for_that_view_only(position, kernel, function,
                                                                                        flex_calls, monkeypatch):
    monkeypatch.setattr(flex, kernel, Compiled(function, "FlexAttention", "the chunked path", remember=False))

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    model = shaw_model() if position == "shaw" else Transformer(micro_config(position=position, max_seq_len=64)).eval()
    idx = torch.randint(0, 97, (1, LENGTH))
    reference = logits(model, idx, use_flex=False)
    with pytest.warns(UserWarning, match="could not be compiled .*No working C"):
        fallen_back = logits(model, idx)
    assert torch.equal(fallen_back, reference)
    layers = model.config.n_layers
    assert len(flex_calls) == layers  # each layer's backend tried once; later forwards of this view do not
    assert torch.equal(logits(model, idx), reference) and len(flex_calls) == layers
    assert all("compiling FlexAttention failed for this model view" in path for path in model.attention_paths().values())
    # Nothing process-wide: another view chooses FlexAttention again and tries it.
    other = model.with_settings(attention_backend="flex")
    with pytest.warns(UserWarning, match="could not be compiled"):
        assert torch.equal(logits(other, idx), reference)
    assert len(flex_calls) == 2 * layers


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_flex_attention_gives_the_chunked_paths_logits_for_fox_in_batches(n_kv_heads, flex_calls):
    """FoX's bias is a query's running sum less a key's (a separable bias): FlexAttention reads both per sequence,
    so batches take it too."""
    model = Transformer(micro_config(position="fox", n_kv_heads=n_kv_heads, max_seq_len=64)).eval()
    with torch.no_grad():
        for gate in model.position.gates.values():
            gate.weight.normal_(0.0, 0.3)
            gate.bias.uniform_(-1.0, 3.0)
    idx = torch.randint(0, model.config.vocab_size, (3, LENGTH))
    assert_flex_matches_the_chunked_path(model, idx, None, flex_calls)


@pytest.mark.parametrize("position", ["alibi", "t5"])
def test_a_windowed_block_mask_gives_the_chunked_paths_windowed_attention(position):
    """flex.attention with a layer's window (taken on CUDA with model.attention_backend = "flex") against the chunked path of a
    windowed layer, run here on the CPU forward: the block mask shows each query its `window` latest keys only."""
    window = 40
    model = Transformer(micro_config(position=position, max_seq_len=64, attention_window=[window])).eval()
    if position == "t5":
        torch.nn.init.normal_(model.position.relative_attention_bias.weight, std=1.0)
    layer = model.layers[0].attention
    positions = torch.arange(LENGTH)[None, :]
    state = model.position.prepare(positions, positions)
    q, k, v = (torch.randn(1, heads, LENGTH, 16) for heads in (4, 2, 2))
    with torch.inference_mode():
        chunked = Masked("the reference").attend(layer, Inputs(q, k, v, model.position, state))
        windowed = flex.attention(q, k, v, model.position, state, 0, window)
        unwindowed = flex.attention(q, k, v, model.position, state, 0)
    assert (windowed - chunked).abs().max() < 1e-5
    assert (unwindowed - chunked)[:, :, window:].abs().max() > 1e-3  # the window matters: the check can fail
    assert (unwindowed - chunked)[:, :, :window].abs().max() < 1e-5  # ... and only past it


def test_a_separable_bias_compiles_with_static_shapes_and_the_distance_kinds_with_dynamic_ones():
    """With symbolic shapes FoX's kernel failed at the second length scored on the CPU and its backward failed to
    lower on CUDA; with static shapes T5's table got wrong gradients there, so the distance kinds keep the dynamic
    kernel (model/attention/flex.py)."""
    assert flex._separable_kernel.options == {"dynamic": False}
    assert "dynamic" not in flex._kernel.options and "dynamic" not in flex._far_kernel.options


def test_fox_takes_flexattention_at_every_length_an_evaluation_scores(flex_calls):
    """Two lengths in one process (an evaluation's 8x and 16x): each takes FlexAttention, each equal to the chunked
    path."""
    model = Transformer(micro_config(position="fox", max_seq_len=64)).eval()
    for length in (LENGTH, 2 * LENGTH):
        idx = torch.randint(0, model.config.vocab_size, (1, length))
        assert_flex_matches_the_chunked_path(model, idx, None, flex_calls)
