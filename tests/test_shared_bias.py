"""T5's bias is shared by all layers: one forward builds it once (bounded), with the same logits and gradients as
building it in every layer."""
import pytest
import torch

import model.encodings.t5 as t5_module
from model.config import ModelConfig
from model.transformer import Transformer


def run(model, idx, targets):
    model.zero_grad()
    calls = []
    handle = model.position.relative_attention_bias.register_forward_hook(lambda *args: calls.append(1))
    logits, loss = model(idx, targets)
    loss.backward()
    handle.remove()
    return logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, len(calls)


def test_one_forward_builds_the_t5_bias_once_with_the_same_logits_and_gradients(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=32,
                                    position="t5"))
    with torch.no_grad():  # non-zero biases, so sharing them is visible in the gradients
        model.position.relative_attention_bias.weight.normal_()
    idx, targets = torch.randint(0, 64, (2, 32)), torch.randint(0, 64, (2, 32))
    shared_logits, shared_grads, shared_calls = run(model, idx, targets)
    monkeypatch.setattr(t5_module, "SHARED_BIAS_ELEMENTS", 0)  # nothing kept: every layer builds its own
    logits, grads, calls = run(model, idx, targets)
    assert (shared_calls, calls) == (1, 3)
    assert torch.allclose(shared_logits, logits, atol=1e-6)
    assert set(grads) == set(shared_grads)
    for name in grads:
        assert torch.allclose(shared_grads[name], grads[name], rtol=1e-5, atol=1e-7), name



@pytest.mark.parametrize("position", ["t5", "kerple", "fire"])
def test_a_learned_bias_trains_through_explicit_attention_with_the_same_logits_and_gradients(position, monkeypatch):
    """With gradients wanted, a bias with parameters takes the explicit chunked steps instead of SDPA's mask (for
    speed): the logits and every parameter's gradient equal those of the SDPA route, with chunks smaller than the
    sequence so that their stitching is covered too."""
    import model.attention.explicit as explicit_backend
    import model.attention.sdpa_mask as masked_backend

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16,
                                    position=position))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith("position."):  # away from FIRE/KERPLE's clamps and T5's zeros
                parameter.uniform_(0.5, 1.5)
    for backend in (masked_backend, explicit_backend):  # chunks of 5 query rows on either path
        monkeypatch.setattr(backend, "CHUNK_ELEMENTS", 2 * 4 * 16 * 5)
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))

    def logits_and_grads(view=model):
        model.zero_grad()
        logits, loss = view(idx, targets)
        loss.backward()
        return logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    sdpa_calls = []
    sdpa = masked_backend.F.scaled_dot_product_attention
    monkeypatch.setattr(masked_backend.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: sdpa_calls.append(1) or sdpa(*args, **kwargs))
    explicit_logits, explicit_grads = logits_and_grads()
    assert not sdpa_calls  # the explicit steps were taken
    # SDPA's mask route, which the rules take for a learned bias where a device has a mask gradient
    sdpa_logits, sdpa_grads = logits_and_grads(model.with_settings(attention_backend="sdpa_mask"))
    assert sdpa_calls  # ... and here SDPA's mask route
    assert torch.allclose(explicit_logits, sdpa_logits, atol=1e-5, rtol=0)
    assert explicit_grads.keys() == sdpa_grads.keys() and any(n.startswith("position.") for n in sdpa_grads)
    for name, grad in sdpa_grads.items():
        assert torch.allclose(explicit_grads[name], grad, atol=1e-5, rtol=1e-4), name
