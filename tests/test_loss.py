"""The fused head + loss (model/loss.py) against the plain path: logits, float32 cross-entropy, autograd."""
import pytest
import torch
import torch.nn.functional as F

from data.batches import IGNORE_INDEX
from model.config import ModelConfig
from model.loss import linear_cross_entropy, token_cross_entropy
from model.transformer import Transformer


def plain(hidden, weight, targets, reduction):
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)).reshape(-1, weight.shape[0]),
                           targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("chunk_elements", [7 * 50, 10**9])  # 7 rows per chunk (uneven), or one chunk
def test_loss_and_gradients_equal_the_plain_path(reduction, chunk_elements):
    torch.manual_seed(0)
    hidden = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 11))
    targets[0, :4] = IGNORE_INDEX
    targets[2, -1] = IGNORE_INDEX
    expected = plain(hidden, weight, targets, reduction)
    grads = torch.autograd.grad(expected * 1.7, (hidden, weight))  # a non-unit upstream gradient
    fused = linear_cross_entropy(hidden, weight, targets, reduction, chunk_elements=chunk_elements)
    fused_grads = torch.autograd.grad(fused * 1.7, (hidden, weight))
    assert torch.allclose(fused, expected, rtol=1e-10)
    for got, want in zip(fused_grads, grads):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)  # float64: the same formula, exactly


def test_only_the_inputs_that_need_gradients_get_them_and_no_grad_works():
    hidden, weight = torch.randn(5, 8), torch.randn(12, 8, requires_grad=True)
    targets = torch.randint(0, 12, (5,))
    (grad_weight,) = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets), (weight,))
    assert torch.allclose(grad_weight, torch.autograd.grad(plain(hidden, weight, targets, "mean"), (weight,))[0],
                          atol=1e-6)
    with torch.inference_mode():
        assert torch.allclose(linear_cross_entropy(hidden, weight, targets), plain(hidden, weight, targets, "mean"))
    with pytest.raises(ValueError, match="'sum' or 'mean'"):
        linear_cross_entropy(hidden, weight, targets, "none")


@pytest.mark.parametrize("tied", [True, False])
def test_the_model_gives_the_same_loss_and_parameter_gradients_without_logits(tied):
    torch.manual_seed(1)
    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16,
                         tie_word_embeddings=tied)
    model = Transformer(config)
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    targets[1, :5] = IGNORE_INDEX
    logits, loss = model(idx, targets, loss_reduction="sum")
    loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    none, fused = model(idx, targets, loss_reduction="sum", return_logits=False)
    fused.backward()
    assert none is None and logits is not None
    assert torch.allclose(fused, loss, rtol=1e-6)
    for name, p in model.named_parameters():
        if name in expected:
            assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-6), name


def test_under_bf16_autocast_the_loss_is_the_plain_paths_within_bf16_precision():
    torch.manual_seed(2)
    hidden, weight = torch.randn(64, 32), torch.randn(300, 32) * 0.2
    targets = torch.randint(0, 300, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(hidden, weight, targets)
        expected = plain(hidden, weight, targets, "mean")
    assert fused.dtype == torch.float32 and abs(float(fused) - float(expected)) < 1e-3 * float(expected)



def test_a_compiled_model_runs_the_fused_loss_eagerly_with_the_same_loss_and_gradients(monkeypatch):
    """Under torch.compile the chunked Function runs outside the graph (traced, it lost every gradient on CUDA with
    torch 2.11: docs/performance.md, "GPU"): its forward is never called while compiling, and loss and gradients equal the
    eager model's."""
    from model.loss import _ChunkedLinearCrossEntropy

    calls = []
    forward = _ChunkedLinearCrossEntropy.forward

    def recording(ctx, *args):
        calls.append(torch.compiler.is_compiling())
        return forward(ctx, *args)

    monkeypatch.setattr(_ChunkedLinearCrossEntropy, "forward", staticmethod(recording))
    torch.manual_seed(1)
    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    model = Transformer(config)
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    targets[1, :5] = IGNORE_INDEX
    _, eager = model(idx, targets, return_logits=False)
    eager.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    none, compiled = torch.compile(model)(idx, targets, return_logits=False)
    compiled.backward()
    assert calls == [False, False]  # once eagerly, once from the compiled model, never while tracing
    assert none is None and torch.allclose(compiled, eager, rtol=1e-5)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.allclose(p.grad, expected[name], rtol=1e-3, atol=1e-6), name


@pytest.mark.parametrize("chunk_elements", [7 * 50, 10**9])
def test_per_token_losses_equal_the_plain_path_without_gradients(chunk_elements):
    torch.manual_seed(0)
    hidden = torch.randn(3, 11, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    targets = torch.randint(0, 50, (3, 11))
    targets[0, :4] = IGNORE_INDEX
    expected = plain(hidden, weight, targets, "none").view(3, 11)
    assert torch.allclose(token_cross_entropy(hidden, weight, targets, chunk_elements=chunk_elements), expected,
                          atol=1e-12)


def test_the_head_runs_at_the_scored_rows_only():
    """A row whose target is IGNORE_INDEX never meets the head: NaN hidden states there leave every loss finite
    (the head at every row would spread them as NaN * 0), and the scored rows' losses are the plain path's."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    targets = torch.randint(0, 50, (2, 9))
    expected = plain(hidden, weight, targets, "none").view(2, 9)
    targets[:, ::2] = IGNORE_INDEX
    hidden[:, ::2] = float("nan")
    losses = token_cross_entropy(hidden, weight, targets, chunk_elements=3 * 50)
    assert torch.isfinite(losses).all() and (losses[:, ::2] == 0).all()
    assert torch.allclose(losses[:, 1::2], expected[:, 1::2], atol=1e-12)


def test_scoring_a_long_window_in_chunks_gives_the_whole_logits_losses(monkeypatch):
    """eval/scoring.py scores forwards past LOGITS_LIMIT through the chunked head: the same losses."""
    import numpy as np

    from eval import scoring

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, max_seq_len=64)).eval()
    windows = np.random.default_rng(0).integers(0, 97, size=(3, 65))
    whole = scoring.score_windows(model, windows)
    incremental = scoring.score_incremental(model, windows, prefill=40)
    monkeypatch.setattr(scoring, "LOGITS_LIMIT", 100)
    assert np.allclose(scoring.score_windows(model, windows), whole, atol=1e-5)
    assert np.allclose(scoring.score_incremental(model, windows, prefill=40), incremental, atol=1e-5)


@pytest.mark.parametrize("limit", [None, 100])  # the whole logits, and the chunked head at the scored rows only
def test_scoring_only_some_targets_gives_their_losses_and_zero_elsewhere(monkeypatch, limit):
    import numpy as np

    from eval import scoring

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, max_seq_len=64)).eval()
    windows = np.random.default_rng(0).integers(0, 97, size=(3, 65))
    whole = scoring.score_windows(model, windows)
    if limit is not None:
        monkeypatch.setattr(scoring, "LOGITS_LIMIT", limit)
    only = np.array([3, 4, 5, 40, 41, 63])
    some = scoring.score_windows(model, windows, only=only)
    assert np.allclose(some[:, only], whole[:, only], atol=1e-5)
    rest = np.setdiff1d(np.arange(64), only)
    assert (some[:, rest] == 0).all() and (whole[:, rest] != 0).all()
