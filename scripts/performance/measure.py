"""What every speed and memory measurement shares: the shapes it runs, our training step and transformers' on random
tokens, a timer's GPU synchronisation, the rotating order of rounds and the process's peak memory. scripts.bench and
scripts.encoding_costs (the user's tools) and this package's experiments import them from here."""
from __future__ import annotations

import contextlib
import io
import resource
import sys
from pathlib import Path
from typing import Iterator

import torch

from infer.hf_convert import llama_model_from
from model.runtime import autocast
from model.transformer import Transformer
from train.config import build_run_config
from train.loop import Trainer, Training

# The shapes of scripts.bench (--shape) and scripts.performance.step_profile: a model's settings and its batch.
SHAPES = {
    # The Foundation's 4.0M-parameter model (configs/tiny.toml).
    "tiny": {"model": dict(vocab_size=4096, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, max_seq_len=256), "batch": 16},
    # For smoke tests of the benchmarks only.
    "micro": {"model": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64), "batch": 4},
    # MiniMind-small-like: 26M parameters.
    "small": {"model": dict(vocab_size=6400, dim=512, n_layers=8, n_heads=8, n_kv_heads=2, max_seq_len=512), "batch": 8},
    # The research shapes, measured on CUDA (docs/performance.md): the literature's small grid (the `gpu` preset's
    # model, configs/compare.toml) at its batch, and a larger one at L = 512; both 16,384 tokens per step, MHA.
    "research6": {"model": dict(vocab_size=4096, dim=384, n_layers=6, n_heads=6, n_kv_heads=6, max_seq_len=128),
                  "batch": 128},
    "research8": {"model": dict(vocab_size=4096, dim=512, n_layers=8, n_heads=8, n_kv_heads=8, max_seq_len=512),
                  "batch": 32},
    # SmolLM2-135M's shape (random weights): the real model of experiments.use_grid and experiments.ruler, whose
    # long forwards (--forward-tokens) set how many windows a CPU session measures.
    "smollm2": {"model": dict(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                              max_seq_len=8192, rope_theta=100000.0), "batch": 1},
}

# The cost tables' shape (scripts.encoding_costs, scripts.performance.flex_costs): the full comparison preset's
# model (dim 256, 4 layers, 8 heads, 4 KV heads, L = 256, vocabulary 4096).
COST_SHAPE = {"vocab_size": 4096, "dim": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 256}


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer measures it (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rotating_rounds(count: int, rounds: int, step: int = 1) -> Iterator[tuple[int, int]]:
    """(round, index) for `rounds` passes over `count` items, each pass starting `step` items later than the one
    before, so that a slow moment of the machine does not always land on the same item."""
    for round_index in range(rounds):
        shift = round_index * step % count
        for index in [*range(shift, count), *range(shift)]:
            yield round_index, index


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM; ru_maxrss would carry the parent's peak over fork + exec)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)


class RandomBatches:
    """Uniformly random token windows (speed does not depend on the text)."""

    def __init__(self, vocab_size: int, batch: int, seq_len: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab_size, (batch, seq_len + 1), generator=generator)

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[:, :-1], self.tokens[:, 1:]

    def val_batches_iter(self):
        yield self.train_batch(0)


def our_trainer(model_values: dict, batch: int, compile_model: bool, out_dir: str, device: torch.device,
                fused_loss: bool | None = None):
    """train.loop's Trainer on random batches: its train_step is exactly what train.pretrain runs."""
    config = build_run_config({
        "model": model_values,
        "train": {"batch_size": batch, "max_steps": 10**6, "warmup_steps": 10, "compile": compile_model,
                  "fused_loss": fused_loss,
                  "log_interval": 10**6, "eval_interval": 10**6, "device": device.type},
        "out": {"dir": out_dir, "overwrite": True},
    })
    batches = RandomBatches(config.model.vocab_size, batch, config.model.max_seq_len)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = Trainer(Training(config, lambda: Transformer(config.model), batches, tokenizer=None))
    step = iter(range(10**9))
    return lambda: trainer.train_step(next(step)), trainer


def hf_trainer(model: Transformer, batch: int, amp: torch.dtype | None, compile_model: bool, device: torch.device):
    """transformers' Llama with the same weights, trained by the textbook loop (fused AdamW, clipping), on the
    device our model trains on. Returns (step, the model)."""
    hf_model = llama_model_from(model).to(device).train()  # load_state_dict copies across devices
    optimizer = torch.optim.AdamW(hf_model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(hf_model) if compile_model else hf_model
    inputs = RandomBatches(model.config.vocab_size, batch, model.config.max_seq_len).tokens[:, :-1].to(device)

    def step() -> None:
        with autocast(device, amp):
            loss = forward(input_ids=inputs, labels=inputs).loss  # transformers shifts the labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf_model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, hf_model
