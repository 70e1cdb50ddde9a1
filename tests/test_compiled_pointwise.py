"""The pointwise passes a long forward without gradients runs compiled on the CPU (runtime.compiled_pointwise): the
RMS norms, the gated feed-forward's act(gate) * up and the scored head's log-sum-exp, each against its eager path;
the head's blocks of rows and words against the plain cross-entropy; the projections' one cast under autocast; the
window's shared chunk masks against the masks computed per chunk; the switch, taken when the model is built."""
import pytest
import torch
import torch.nn.functional as F

from data.batches import IGNORE_INDEX
from model import Transformer, layers, loss
from model import compiled as compiling
from model.attention import chunks
from model.layers import GatedFFN, RMSNorm, autocast_input
from model.runtime import RuntimeConfig, autocast
from tests.conftest import CountingKernel, micro_config
from tests.test_gemma import micro_gemma, perturbed


@pytest.fixture
def compiled_calls(monkeypatch):
    """Every pointwise pass without gradients takes its compiled kernel (not only long ones); counts the calls."""
    calls = []
    monkeypatch.setattr(compiling, "COMPILED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(layers, "_COMPILED_NORM", CountingKernel(layers._COMPILED_NORM, calls))
    monkeypatch.setattr(layers, "_COMPILED_GATED", {name: CountingKernel(kernel, calls)
                                                    for name, kernel in layers._COMPILED_GATED.items()})
    monkeypatch.setattr(loss, "_COMPILED_BLOCK", CountingKernel(loss._COMPILED_BLOCK, calls))
    return calls


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_the_compiled_norm_equals_the_eager_one(offset, compiled_calls):
    torch.manual_seed(0)
    norm = RMSNorm(40, 1e-6, offset)
    norm.weight.data.add_(torch.randn(40))
    x = 3 * torch.randn(2, 7, 40)
    with torch.no_grad():
        fast = norm(x)
        assert len(compiled_calls) == 1
        eager = layers.rms_norm(x, norm.weight, 1e-6, offset)
        assert (fast - eager).abs().max() < 1e-5
        # heads of a transposed view (QK-norm's queries), in bfloat16: within one rounding of the eager result
        q = (3 * torch.randn(2, 9, 3, 40)).bfloat16().transpose(1, 2)
        fast, eager = norm(q), layers.rms_norm(q, norm.weight, 1e-6, offset)
        assert fast.dtype == eager.dtype and fast.shape == eager.shape
        assert ((fast.float() - eager.float()).abs() <= 2 ** -7 * eager.float().abs() + 1e-6).all()
        assert len(compiled_calls) == 2
        # the comparison can fail: the other convention's gain is far off
        assert (norm(x) - layers.rms_norm(x, norm.weight, 1e-6, 1.0 - offset)).abs().max() > 0.5


def test_norms_with_gradients_stay_eager(compiled_calls):
    norm = RMSNorm(40, 1e-6, 1.0)
    x = torch.randn(3, 40, requires_grad=True)
    norm(x).sum().backward()
    assert not compiled_calls and x.grad is not None


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_the_compiled_gated_product_equals_the_eager_one(activation, compiled_calls):
    torch.manual_seed(0)
    ffn = GatedFFN(24, 40, activation)
    x = torch.randn(2, 5, 24)
    with torch.no_grad():
        fast = ffn(x)
        assert len(compiled_calls) == 1
        eager = ffn.down_proj(ffn.activation(ffn.gate_proj(x)) * ffn.up_proj(x))
        assert (fast - eager).abs().max() < 1e-5
        other = "silu" if activation == "gelu_tanh" else "gelu_tanh"
        assert (fast - ffn.down_proj(layers.ACTIVATIONS[other](ffn.gate_proj(x)) * ffn.up_proj(x))).abs().max() > 1e-3


@pytest.mark.parametrize("rows, chunk_elements", [(4, 7 * 5), (2048, 7 * 50), (2048, 10**9)])
def test_the_head_in_blocks_of_rows_and_words_gives_the_plain_losses(monkeypatch, rows, chunk_elements):
    """Rows in blocks of `rows` and words in blocks of chunk_elements / rows (1 to 50 words: a row's log-sum-exp
    gathered over up to 50 blocks, its target's logit from the one block that holds it)."""
    monkeypatch.setattr(loss, "HEAD_ROWS", rows)
    torch.manual_seed(0)
    hidden = torch.randn(3, 11, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    targets = torch.randint(0, 50, (3, 11))
    targets[0, :4] = IGNORE_INDEX
    targets[1, 0], targets[1, 1] = 0, 49  # the first and last word: the edges of the first and last blocks
    expected = F.cross_entropy((hidden @ weight.T).view(-1, 50), targets.view(-1), reduction="none").view(3, 11)
    got = loss.token_cross_entropy(hidden, weight, targets, chunk_elements=chunk_elements)
    assert torch.allclose(got, expected, atol=1e-12)


def test_the_compiled_head_losses_equal_the_eager_ones_under_autocast(compiled_calls):
    torch.manual_seed(0)
    hidden, weight = torch.randn(2, 30, 16), torch.randn(300, 16)
    targets = torch.randint(0, 300, (2, 30))
    targets[1, ::3] = IGNORE_INDEX  # 50 rows scored: one block of rows, of 2,400 / 50 = 48 words, 7 blocks
    with autocast(torch.device("cpu"), torch.bfloat16):
        fast = loss.token_cross_entropy(hidden, weight, targets, chunk_elements=2400)
        assert len(compiled_calls) == 7
        eager = loss.token_cross_entropy(hidden, weight, targets, chunk_elements=2400, compiled=False)
        assert len(compiled_calls) == 7  # runtime.compiled_pointwise = false: nothing compiled
    assert fast.dtype == torch.float32 and (fast - eager).abs().max() < 1e-4
    assert (fast[1, ::3] == 0).all() and (fast[1, 1::3] > 0).all()


def test_autocast_input_is_the_cast_autocast_makes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(5, 16)
    with autocast(torch.device("cpu"), torch.bfloat16):
        once = autocast_input(x)
        assert once.dtype == torch.bfloat16
        assert torch.equal(linear(once), linear(x))  # bit for bit what autocast's own cast gives
        assert autocast_input(x.double()).dtype == torch.float64  # autocast leaves float64 alone
    assert autocast_input(x) is x  # no autocast: nothing cast


def test_a_windows_chunks_share_masks_equal_to_each_chunks_own():
    q = torch.zeros(1, 2, 23, 4)
    k = torch.zeros(1, 1, 23, 4)

    class Inputs:  # the fields chunks() reads, a forward without a KV cache or an attention method
        static, causal, kv_cache, methods = False, True, None, None

    inputs = Inputs()
    inputs.q, inputs.k = q, k
    seen = list(chunks.chunks(inputs, rows_per_chunk=4, window=4))
    assert len(seen) == 6
    for chunk in seen:
        own = chunks.visible_keys(23, 23, q.device, None, chunk.rows, chunk.keys, window=4)
        assert torch.equal(chunk.visible, own), chunk.rows
    assert seen[2].visible is seen[3].visible  # one mask for the chunks alike
    assert not torch.equal(seen[0].visible, seen[1].visible[:, : seen[0].visible.shape[1]])  # the first differs


def test_a_micro_gemma_scores_alike_with_and_without_the_compiled_passes(compiled_calls):
    """The whole forward of a Gemma-shaped model (sandwich and QK norms, GeGLU, the head at the scored rows), in
    float32: the compiled passes agree with the eager model's within float rounding, and the switch reaches every
    norm and feed-forward when the model is built."""
    model = perturbed(micro_gemma())
    eager = Transformer(model.config, RuntimeConfig(compiled_pointwise=False)).eval()
    eager.load_state_dict(model.state_dict())
    assert {m.compiled for m in eager.modules() if isinstance(m, (RMSNorm, GatedFFN))} == {False}
    assert {m.compiled for m in model.modules() if isinstance(m, (RMSNorm, GatedFFN))} == {True}
    idx = torch.randint(0, 97, (2, 41))
    targets = idx[:, 1:].clone()
    targets[:, ::4] = IGNORE_INDEX
    with torch.no_grad():
        fast = model(idx[:, :-1], targets, loss_reduction="none", return_logits=False)[1]
        calls = len(compiled_calls)
        slow = eager(idx[:, :-1], targets, loss_reduction="none", return_logits=False)[1]
    assert calls == 6 * (6 + 1) + 1 + 1 and len(compiled_calls) == calls  # 6 norms and a feed-forward a layer,
    # the final norm, one block of the head
    assert (fast - slow).abs().max() < 1e-4 and (slow[:, 1::4] > 0).all()


def test_a_llama_model_takes_the_switch_too():
    model = Transformer(micro_config(), RuntimeConfig(compiled_pointwise=False))
    assert not model.norm.compiled and not model.layers[0].ffn.compiled
    assert not model.view(micro_config()).layers[0].attention_norm.compiled  # a view shares its trunk's norms


def test_a_compiler_failure_warns_once_and_the_norms_and_head_run_eagerly(monkeypatch):
    from model.compiled import Compiled

    monkeypatch.setattr(compiling, "COMPILED_MIN_ELEMENTS", 1)
    norm_kernel = Compiled(layers.rms_norm, "RMSNorm", "norms run eagerly")
    head_kernel = Compiled(loss.block_scores, "the head's cross-entropy", "it runs eagerly")
    monkeypatch.setattr(layers, "_COMPILED_NORM", norm_kernel)
    monkeypatch.setattr(loss, "_COMPILED_BLOCK", head_kernel)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    norm = RMSNorm(16, 1e-6, 1.0)
    x, weight, targets = torch.randn(3, 16), torch.randn(20, 16), torch.randint(0, 20, (3,))
    with torch.no_grad():
        with pytest.warns(UserWarning, match="RMSNorm could not be compiled .*No working C"):
            normed = norm(x)
        with pytest.warns(UserWarning, match="cross-entropy could not be compiled"):
            losses = loss.token_cross_entropy(x, weight, targets)
        assert norm_kernel.failure is not None and head_kernel.failure is not None
        assert torch.equal(normed, layers.rms_norm(x, norm.weight, 1e-6, 1.0))
        assert torch.allclose(losses, F.cross_entropy(x @ weight.T, targets, reduction="none"), atol=1e-6)
