"""The CUDA paths, on a GPU: skipped where torch sees none (CI has none).

    python -m pytest tests/test_cuda.py          # on a machine with a CUDA GPU

The model's numbers on the GPU equal the CPU's for every encoding (fp32, TF32 off), incremental decoding equals a
full forward there, and the commands that take --device / --train.device (training with pinned-memory batches,
compiled training, resume, evaluation, generation, the bench) run on it. Every other test module runs on a GPU
machine too: their CLI calls take the default device (auto), which is then CUDA.
"""
import json

import numpy as np
import pytest
import torch

from model import KVCache, Transformer
from model.checkpoint import load_model, load_trainer_state
from tests.conftest import micro_config
from tests.test_position import VARIANTS, variant_id
from tests.test_train import losses as logged

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _full_fp32_matmuls():
    """TF32 would round fp32 matmuls to 10-bit mantissas: the CPU comparison is of fp32 arithmetic."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def settings_for(variant: dict, length: int) -> dict:
    """Dynamic NTK is checked past its trained length (its frequencies then depend on the length); learned
    positions only within their table."""
    dynamic = variant.get("rope_scaling", {}).get("rope_type") == "dynamic"
    return {**variant, "max_seq_len": length // 3 if dynamic else length}


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cuda_logits_and_gradients_equal_the_cpus(variant):
    config = micro_config(**settings_for(variant, 24))
    model = Transformer(config)
    idx = torch.randint(0, config.vocab_size, (2, 24))
    logits, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model.to(CUDA)
    cuda_logits, cuda_loss = model(idx[:, :-1].to(CUDA), idx[:, 1:].to(CUDA))
    cuda_loss.backward()
    assert (cuda_logits.cpu() - logits).abs().max() < 1e-4
    for name, p in model.named_parameters():
        if name in grads:
            assert (p.grad.cpu() - grads[name]).abs().max() < 1e-4 * max(1.0, grads[name].abs().max()), name


@pytest.mark.parametrize("position", ["rope", "alibi", "t5", "shaw", "kerple", "fire", "cope", "xpos", "none"])
def test_cuda_equals_cpu_at_16x_the_trained_length(position):
    """The chunked bias path and RoPE's long tables on the GPU, 16x past L = 16."""
    config = micro_config(position=position, max_seq_len=16)
    model = Transformer(config).eval()
    idx = torch.randint(0, config.vocab_size, (1, 256))
    with torch.no_grad():
        cpu = model(idx)[0]
        gpu = model.to(CUDA)(idx.to(CUDA))[0].cpu()
    assert (gpu - cpu).abs().max() < 1e-4


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_cuda_kv_cache_steps_equal_full_forwards(variant):
    dynamic = variant.get("rope_scaling", {}).get("rope_type") == "dynamic"
    config = micro_config(**settings_for(variant, 24), n_layers=1 if dynamic else 2)
    model = Transformer(config).eval().to(CUDA)
    idx = torch.randint(0, config.vocab_size, (2, 24), device=CUDA)
    cache = KVCache.for_model(config, batch_size=2, max_len=24)
    with torch.no_grad():
        model(idx[:, :6], kv_cache=cache)
        for t in range(6, 24):
            step = model(idx[:, t : t + 1], kv_cache=cache)[0][:, -1]
            assert (step - model(idx[:, : t + 1])[0][:, -1]).abs().max() < 1e-4, t


def test_bf16_autocast_on_cuda_follows_fp32():
    from model.runtime import autocast

    config = micro_config(dim=128, n_layers=2, max_seq_len=64)
    model = Transformer(config).to(CUDA)
    idx = torch.randint(0, config.vocab_size, (4, 65), device=CUDA)
    with torch.no_grad():
        _, fp32 = model(idx[:, :-1], idx[:, 1:])
        with autocast(CUDA, torch.bfloat16):
            logits, bf16 = model(idx[:, :-1], idx[:, 1:])
    assert abs(bf16.item() - fp32.item()) < 0.02 * fp32.item()


TRAIN = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
         "--model.max_seq_len=64", "--train.batch_size=8", "--train.warmup_steps=2", "--train.log_interval=1",
         "--train.eval_interval=4", "--train.eval_batches=2", "--train.device=cuda"]


def test_training_on_cuda_learns_resumes_and_loads_on_the_cpu(prepared_data, tmp_path):
    """train.loop on the GPU (bf16 autocast, pinned-memory batches, fused AdamW): the loss falls; a run interrupted
    at step 7 and resumed follows the uninterrupted one (to GPU rounding: its kernels need not be deterministic);
    the checkpoint gives the GPU's logits on the CPU."""
    from data.batches import PretrainBatches
    from tests.test_train import InterruptAt, make_config, train
    from train.loop import TrainingInterrupted

    straight = make_config(prepared_data, tmp_path / "straight", "--train.device=cuda", "--train.dtype=bfloat16")
    train(straight, prepared_data)
    interrupted = make_config(prepared_data, tmp_path / "resumed", "--train.device=cuda", "--train.dtype=bfloat16")
    with pytest.raises(TrainingInterrupted):
        train(interrupted, prepared_data,
              batches=InterruptAt(PretrainBatches(prepared_data, 64, 4, interrupted.train.seed, 2), 7))
    assert load_trainer_state(tmp_path / "resumed")["step"] == 7
    train(interrupted, prepared_data, resume=True)
    a, b = logged(tmp_path / "straight"), logged(tmp_path / "resumed")
    assert sorted(a) == sorted(b) == list(range(1, 13))
    assert a[12] < a[1] - 0.2
    assert np.allclose([a[s] for s in a], [b[s] for s in a], rtol=2e-3), (a, b)
    on_gpu = load_model(tmp_path / "straight", CUDA).eval()
    on_cpu = load_model(tmp_path / "straight", torch.device("cpu")).eval()
    assert next(on_gpu.parameters()).is_cuda
    idx = torch.randint(0, 512, (2, 64))
    with torch.no_grad():
        assert (on_gpu(idx.to(CUDA))[0].cpu() - on_cpu(idx)[0]).abs().max() < 1e-4


def test_compiled_training_on_cuda_follows_eager(prepared_data, tmp_path):
    from train.pretrain import main as pretrain

    for name, compiled in (("eager", "false"), ("compiled", "true")):
        assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={tmp_path / name}", *TRAIN,
                         "--train.max_steps=6", f"--train.compile={compiled}", "--train.dtype=float32"]) == 0
    eager, compiled = logged(tmp_path / "eager"), logged(tmp_path / "compiled")
    assert sorted(eager) == sorted(compiled)
    assert eager[max(eager)] < eager[min(eager)] - 0.2, eager
    assert np.allclose([eager[s] for s in eager], [compiled[s] for s in eager], rtol=1e-3), (eager, compiled)


def test_perplexity_on_cuda_equals_the_cpus_and_generation_runs(prepared_data, tmp_path, capsys):
    from eval.perplexity import main as perplexity
    from scripts.generate import main as generate
    from train.pretrain import main as pretrain

    run = tmp_path / "run"
    assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={run}", *TRAIN, "--train.max_steps=20"]) == 0
    results = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        assert perplexity(["--checkpoint", str(run), "--data", str(prepared_data), "--length", "64", "--tokens",
                           "4096", "--device", device, "--out", str(out)]) == 0
        results[device] = json.loads((out / "results.json").read_text())["nll"]
    assert results["cuda"] == pytest.approx(results["cpu"], rel=1e-4)
    capsys.readouterr()
    assert generate(["--checkpoint", str(run), "--prompt", "def ", "--max-new-tokens", "12", "--temperature", "0",
                     "--device", "cuda"]) == 0
    assert "def " in capsys.readouterr().out


def test_bench_runs_every_contestant_on_cuda(tmp_path):
    from scripts.bench import main as bench

    assert bench(["--shape", "micro", "--repeats", "1", "--train-steps", "1", "--new-tokens", "4", "--long-tokens",
                  "128", "--long-positions", "rope", "--device", "cuda", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench-micro.json").read_text())
    training, generation = results["training"]["modes"], results["generation"]["modes"]
    assert results["device"] == "cuda"
    assert {mode["device"] for mode in [*training.values(), *generation.values()]} == {"cuda"}
    assert all(mode["tokens_per_s"] > 0 for mode in [*training.values(), *generation.values()])


# FlexAttention on CUDA (model.attention_backend = "flex"; "auto" does not take it there: Flex.why_not), against
# the chunked path, which stays the reference: the same logits in fp32, and the same gradients in training.
FLEX_CUDA = ["alibi", "t5", "kerple", "shaw", "fox"]


def flex_cuda_model(position: str, max_seq_len: int = 64, **settings) -> Transformer:
    """A model whose bias is far from its initial values (a trained model's differ from distance to distance)."""
    model = Transformer(micro_config(position=position, max_seq_len=max_seq_len, **settings))
    with torch.no_grad():
        for name, parameter in model.position.named_parameters():
            if position in ("t5", "shaw"):
                parameter.normal_(0.0, 1.0)
            elif position == "fox":
                parameter.uniform_(-1.0, 3.0) if name.endswith("bias") else parameter.normal_(0.0, 0.3)
    return model.to(CUDA)


def run_with_flex_cuda(model: Transformer, on: bool, fn):
    """fn(view) on a view of the model with model.attention_backend = "flex" (on) or "auto", and the paths its
    layers took."""
    view = model.with_settings(attention_backend="flex" if on else "auto")
    result = fn(view)
    return result, view.attention_paths()


@pytest.mark.parametrize("window", [0, 48], ids=["global", "window"])
@pytest.mark.parametrize("position", FLEX_CUDA)
def test_flex_on_cuda_gives_the_chunked_paths_logits(position, window):
    if window and position == "shaw":
        pytest.skip("a clipped bias keeps the chunked path with a window")
    model = flex_cuda_model(position, **({"attention_window": [window]} if window else {})).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 300), device=CUDA)  # a batch, not a multiple of 128

    def forward(view):
        with torch.no_grad():
            return view(idx)[0]

    reference, chunked_paths = run_with_flex_cuda(model, False, forward)
    fast, flex_paths = run_with_flex_cuda(model, True, forward)
    assert all(path.startswith("sdpa_mask") or path.startswith("explicit") for path in chunked_paths.values())
    assert all(path.startswith("flex") for path in flex_paths.values()), flex_paths
    assert (fast - reference).abs().max() < 1e-4


@pytest.mark.parametrize("position", FLEX_CUDA)
def test_flex_on_cuda_trains_with_the_chunked_paths_gradients(position):
    """A training forward (gradients, L = 128) takes FlexAttention when named; the loss and every gradient,
    the bias's own parameters included, equal the chunked path's."""
    model = flex_cuda_model(position, max_seq_len=128).train()
    idx = torch.randint(0, model.config.vocab_size, (4, 129), device=CUDA)

    def step(view):
        model.zero_grad()
        loss = view(idx[:, :-1], idx[:, 1:])[1]
        loss.backward()
        return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    (loss, grads), chunked_paths = run_with_flex_cuda(model, False, step)
    (flex_loss, flex_grads), flex_paths = run_with_flex_cuda(model, True, step)
    assert all(path.startswith("flex") for path in flex_paths.values()), flex_paths
    assert not any(path.startswith("flex") for path in chunked_paths.values())
    assert flex_loss == pytest.approx(loss, rel=1e-5)
    assert set(flex_grads) == set(grads)
    assert any(name.startswith("position") for name in grads) or position == "alibi"
    for name, grad in grads.items():
        assert (flex_grads[name] - grad).abs().max() < 1e-4 * max(1.0, grad.abs().max().item()), name


@pytest.mark.parametrize("position", ["alibi", "t5", "fox"])
def test_flex_on_cuda_under_bf16_autocast_follows_fp32(position):
    from model.runtime import autocast

    model = flex_cuda_model(position, max_seq_len=128).train()
    idx = torch.randint(0, model.config.vocab_size, (4, 129), device=CUDA)

    def loss(view, amp):
        with autocast(CUDA, amp):
            return view(idx[:, :-1], idx[:, 1:])[1].item()

    fp32, _ = run_with_flex_cuda(model, False, lambda view: loss(view, None))
    bf16, paths = run_with_flex_cuda(model, True, lambda view: loss(view, torch.bfloat16))
    assert all(path.startswith("flex") for path in paths.values()), paths
    assert abs(bf16 - fp32) < 0.02 * fp32
