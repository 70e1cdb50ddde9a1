"""torchrun data parallelism: 2 gloo processes follow the single-process run with the same global batch."""
import json
import subprocess
import sys

import pytest
import torch

from model.checkpoint import load_model, load_trainer_state
from tests.conftest import ROOT
from train.distributed import Distributed

MICRO = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
         "--model.n_kv_heads=2", "--model.max_seq_len=64", "--train.batch_size=4", "--train.max_steps=6",
         "--train.warmup_steps=2", "--train.log_interval=1", "--train.eval_interval=3", "--train.eval_batches=2",
         "--train.dtype=float32", "--train.device=cpu"]  # gloo, also on a machine with a GPU


def launch(module, *args, processes=1):
    """`python -m MODULE ARGS`, under torchrun with `processes` > 1; asserts it succeeded."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] \
        if processes > 1 else [sys.executable]
    finished = subprocess.run([*launcher, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert finished.returncode == 0, finished.stderr[-3000:]
    return finished


def pretrain(prepared_data, out, *extra, processes=1):
    return launch("train.pretrain", f"--data.dir={prepared_data}", f"--out.dir={out}", *MICRO, *extra,
                  processes=processes)


def records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration  # torchrun, 2 gloo processes
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_two_gloo_processes_match_one_process(prepared_data, tmp_path, grad_accum):
    extra = [f"--train.grad_accum={grad_accum}"]
    pretrain(prepared_data, tmp_path / "single", *extra)
    two = pretrain(prepared_data, tmp_path / "ddp", *extra, processes=2)
    assert "2 processes (DDP)" in two.stdout
    assert two.stdout.count("final val_loss") == 1  # only rank 0 reports
    single, ddp = records(tmp_path / "single"), records(tmp_path / "ddp")
    assert [sorted(r) for r in single] == [sorted(r) for r in ddp]  # rank 0 alone logged: no duplicate lines
    for a, b in zip(single, ddp):
        for key in ("loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a, b)
    reference, parallel = load_model(tmp_path / "single"), load_model(tmp_path / "ddp")
    for (name, p), q in zip(reference.named_parameters(), parallel.parameters()):
        assert torch.allclose(p, q, atol=2e-5, rtol=1e-4), name
    assert load_trainer_state(tmp_path / "ddp")["tokens_seen"] == load_trainer_state(tmp_path / "single")["tokens_seen"]


def test_without_torchrun_everything_is_single_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    context = Distributed()
    batch = torch.arange(8).view(4, 2)
    assert not context.enabled and context.is_main
    assert context.shard(batch) is batch and context.start(torch.device("cpu"), 3) == torch.device("cpu")


def test_global_batch_must_divide_over_the_processes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    from errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.batch_size \(3\) is the global micro-batch .* multiple of 2"):
        Distributed().start(torch.device("cpu"), 3)


@pytest.mark.integration  # torchrun, 2 gloo processes
def test_sft_under_two_gloo_processes_matches_one_process(prepared_data, tmp_path):
    """train.sft under torchrun: the same losses and weights as one process with the same global batch."""
    from tests.test_sft import write_conversations

    pretrain(prepared_data, tmp_path / "base")
    write_conversations(tmp_path / "chat.jsonl", 60)
    runs = {}
    for name, processes in (("single", 1), ("ddp", 2)):
        launch("train.sft", "--checkpoint", str(tmp_path / "base"), f"--data.source={tmp_path / 'chat.jsonl'}",
               f"--out.dir={tmp_path / name}", "--train.batch_size=4", "--train.max_steps=4", "--train.warmup_steps=1",
               "--train.log_interval=1", "--train.eval_interval=2", "--train.eval_batches=2", "--train.dtype=float32",
               "--train.device=cpu", processes=processes)
        runs[name] = records(tmp_path / name)
    assert len(runs["single"]) == len(runs["ddp"]) > 0
    for a, b in zip(runs["single"], runs["ddp"]):
        for key in ("loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a, b)
    reference, parallel = load_model(tmp_path / "single"), load_model(tmp_path / "ddp")
    for (name, p), q in zip(reference.named_parameters(), parallel.parameters()):
        assert torch.allclose(p, q, atol=2e-5, rtol=1e-4), name


def test_more_processes_than_gpus_is_a_clear_error(monkeypatch):
    """nccl needs one GPU per process: a second process on a one-GPU machine is refused by name, not by nccl."""
    from errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="has 1 GPU.*--nproc_per_node=1.*--train.device=cpu"):
        Distributed().start(torch.device("cuda"), batch_size=4)
