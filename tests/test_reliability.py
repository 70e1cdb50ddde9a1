"""Failures say what to do and lose nothing: non-finite losses, learned-table limits, over-long prompts."""
import json
import math

import pytest
import torch

from data.batches import PretrainBatches
from data.tokenizer import load_tokenizer
from errors import ConfigError
from model import Transformer
from model.checkpoint import load_model, load_trainer_state
from tests.conftest import micro_config
from tests.test_generate import run
from tests.test_train import make_config
from train.loop import NonFiniteLoss, Training, run_training


def poisoned_model(config, bad_calls):
    """A model whose training loss is NaN on the given forward calls (counted from 1)."""
    model = Transformer(config.model)
    original = model.forward
    calls = {"n": 0}

    def forward(idx, targets=None, **kwargs):
        logits, loss = original(idx, targets, **kwargs)
        if model.training:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    model.forward = forward
    return model


def test_nonfinite_step_is_skipped_and_logged(prepared_data, tmp_path):
    config = make_config(prepared_data, tmp_path / "skip", "--train.max_steps=8")
    batches = PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
    result = run_training(Training(config, lambda: poisoned_model(config, {3}), batches, load_tokenizer(prepared_data)))
    records = [json.loads(line) for line in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in records if "action" in r]
    assert len(skipped) == 1 and skipped[0]["step"] == 3 and skipped[0]["action"] == "skip"
    assert math.isnan(skipped[0]["nonfinite_loss"])
    assert math.isfinite(result.final_val_loss)  # the NaN step never touched the weights
    model = load_model(tmp_path / "skip")
    assert all(bool(p.isfinite().all()) for p in model.parameters())
    assert load_trainer_state(tmp_path / "skip")["nonfinite_steps"] == 1


def test_skipping_on_the_device_equals_skipping_on_the_host(prepared_data, tmp_path, monkeypatch):
    """The default skip (fused AdamW's found_inf, reported at the next log) applies exactly the same updates as
    dropping the step on the host, also when the bad step falls inside a log interval."""
    import train.nonfinite

    runs = {}
    for name, on_device in (("device", True), ("host", False)):
        monkeypatch.setattr(train.nonfinite, "skips_on_device", lambda policy, optimizer, flag=on_device: flag)
        config = make_config(prepared_data, tmp_path / name, "--train.max_steps=8", "--train.log_interval=4")
        batches = PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
        run_training(Training(config, lambda: poisoned_model(config, {3}), batches, load_tokenizer(prepared_data)))
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        skips = [(r["step"], r["action"]) for r in records if "action" in r]
        runs[name] = (load_model(tmp_path / name).state_dict(), skips, load_trainer_state(tmp_path / name))
    assert runs["device"][1] == runs["host"][1] == [(3, "skip")]
    assert runs["device"][2]["nonfinite_steps"] == runs["host"][2]["nonfinite_steps"] == 1
    for name, tensor in runs["host"][0].items():
        assert torch.equal(tensor, runs["device"][0][name]), name


def test_nonfinite_stop_keeps_the_last_good_checkpoint(prepared_data, tmp_path):
    config = make_config(prepared_data, tmp_path / "stop", "--train.max_steps=12", "--train.nonfinite=stop")
    batches = PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
    with pytest.raises(NonFiniteLoss, match="step 7: non-finite loss nan: stopping .*last good checkpoint"):
        run_training(Training(config, lambda: poisoned_model(config, {7}), batches, load_tokenizer(prepared_data)))
    state = load_trainer_state(tmp_path / "stop")
    assert state["step"] == 4  # saved at the last evaluation before the bad step (eval_interval 4)
    assert all(bool(p.isfinite().all()) for p in load_model(tmp_path / "stop").parameters())


def test_too_many_skips_stop(prepared_data, tmp_path):
    config = make_config(prepared_data, tmp_path / "many", "--train.max_steps=12", "--train.max_nonfinite_skips=1")
    batches = PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
    with pytest.raises(NonFiniteLoss, match="more than 1 skipped"):
        run_training(Training(config, lambda: poisoned_model(config, {2, 5}), batches, load_tokenizer(prepared_data)))


def test_sequence_length_beyond_a_learned_table_is_a_config_error():
    with pytest.raises(ConfigError, match=r"max_seq_len \(64\) is beyond the learned table of 32 positions"):
        micro_config(position="learned", max_seq_len=64, position_args={"learned": {"max_positions": 32}})


@pytest.mark.integration  # trains a run, ~20 s
def test_prompt_longer_than_the_context_is_refused(prepared_data, tmp_path):
    from train.pretrain import main as pretrain

    assert pretrain(["--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
                     "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.max_steps=1", "--train.batch_size=2",
                     "--train.eval_batches=1", f"--data.dir={prepared_data}", f"--out.dir={tmp_path / 'run'}"]) == 0
    long_prompt = "def f(x):\n    return x\n" * 10
    refused = run("scripts.generate", "--checkpoint", str(tmp_path / "run"), "--prompt", long_prompt, "--max-new-tokens", "2")
    assert refused.returncode == 2 and "more than the 16 the model was trained on" in refused.stderr
    # A short prompt whose continuation would run past the context is refused the same way (as --chat does).
    past = run("scripts.generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "def", "--max-new-tokens", "30")
    assert past.returncode == 2 and "plus --max-new-tokens 30" in past.stderr
    no_factor = run("scripts.generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "def", "--max-new-tokens",
                    "2", "--rope-scaling", "yarn")
    assert no_factor.returncode == 2 and "--rope-scaling yarn needs --rope-factor" in no_factor.stderr
    for extra in (["--extrapolate"], ["--rope-scaling", "yarn", "--rope-factor", "8"]):
        allowed = run("scripts.generate", "--checkpoint", str(tmp_path / "run"), "--prompt", long_prompt,
                      "--max-new-tokens", "2", *extra)
        assert allowed.returncode == 0, allowed.stderr


def test_a_second_writer_is_refused_with_the_holders_pid_and_a_dead_holders_lock_is_taken_over(prepared_data,
                                                                                                tmp_path, capsys):
    """Two writers on one folder: while another process holds it, training there is refused at once naming that
    process and nothing in the folder changes; after the holder is killed (SIGKILL, no clean-up), the next writer
    takes the folder over and says from whom."""
    import subprocess
    import sys
    import time

    from model.folder_lock import LOCK_NAME

    out = tmp_path / "run"
    train = make_config(prepared_data, out, "--train.max_steps=2")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, '.'); from model.folder_lock import FolderLock; "
        f"lock = FolderLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        started = time.perf_counter()
        with pytest.raises(ConfigError, match=f"being written by another training run \\(process {holder.pid}\\)"):
            run_training(Training(train, lambda: Transformer(train.model), PretrainBatches(prepared_data, 64, 4, 0, 2),
                         load_tokenizer(prepared_data)))
        assert time.perf_counter() - started < 5  # refused at once, not after waiting
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        holder.kill()
        holder.wait()
    assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)  # left behind by the killed process
    run_training(Training(train, lambda: Transformer(train.model), PretrainBatches(prepared_data, 64, 4, 0, 2),
                 load_tokenizer(prepared_data)))
    assert f"took over {out / LOCK_NAME} from process {holder.pid}" in capsys.readouterr().err
    assert load_trainer_state(out)["step"] == 2
    assert (out / LOCK_NAME).read_text() == ""  # released cleanly: nothing to report next time


@pytest.mark.parametrize("damage, message", [
    ("truncate", "not a whole number of uint16 tokens"),
    ("uint32", "it holds uint32 tokens but meta.json says uint16"),
    ("short", "meta.json says"),
    ("out_of_vocab", "holds token id 60000, but the vocabulary has 512 ids"),
])
def test_damaged_token_files_are_refused_on_open(prepared_data, tmp_path, damage, message):
    """A truncated train.bin, one of another dtype, one shorter than meta.json says, and an id outside the
    vocabulary: each is refused when opened, through the CLI with exit 2 and one line naming the file."""
    import shutil

    import numpy as np

    data = tmp_path / "data"
    shutil.copytree(prepared_data, data)
    path = data / "train.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "uint32":
        tokens.astype(np.uint32).tofile(path)
    elif damage == "short":
        tokens[:-10].tofile(path)
    else:
        tokens[len(tokens) // 2] = 60000
        tokens.tofile(path)
    from errors import DataError

    with pytest.raises(DataError, match=message):
        PretrainBatches(data, 64, 4, 0, 2)
    result = run("train.pretrain", f"--data.dir={data}", f"--out.dir={tmp_path / 'run'}", "--model.vocab_size=512",
                 "--model.dim=64", "--model.n_layers=1", "--model.max_seq_len=16", "--train.max_steps=1")
    assert result.returncode == 2 and str(path) in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error:")


@pytest.mark.integration  # trains and resumes a run, ~15 s
def test_resume_continues_that_run_with_its_own_settings(prepared_data, tmp_path):
    """The newcomer findings: --config with a longer run does not extend a short one on --resume (and its
    run_config.toml is not rewritten from the file); --train.max_steps on the command line does, with a note; a
    setting a run cannot change is refused; the metrics log keeps the short run's final evaluation."""
    import json as jsonlib

    out = tmp_path / "run"
    toml = tmp_path / "long.toml"
    toml.write_text("[train]\nmax_steps = 450\nlr = 0.01\n")
    base = ["--data.dir=" + str(prepared_data), f"--out.dir={out}", "--model.vocab_size=512", "--model.dim=64",
            "--model.n_layers=1", "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1",
            "--train.eval_interval=3", "--train.warmup_steps=1"]
    assert run("train.pretrain", *base, "--train.max_steps=4").returncode == 0
    run_config = (out / "run_config.toml").read_text()
    records = (out / "metrics.jsonl").read_text()
    resumed = run("train.pretrain", "--config", str(toml), f"--out.dir={out}", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "keeps the run's own settings for" in resumed.stderr and "train.max_steps" in resumed.stderr
    assert load_trainer_state(out)["step"] == 4 and (out / "run_config.toml").read_text() == run_config
    assert (out / "metrics.jsonl").read_text() == records  # nothing dropped, nothing redone
    further = run("train.pretrain", f"--out.dir={out}", "--resume", "--train.max_steps=7")
    assert further.returncode == 0, further.stderr
    assert "--resume changes train.max_steps = 7" in further.stderr and load_trainer_state(out)["step"] == 7
    lines = [jsonlib.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluated = [record["step"] for record in lines if "val_loss" in record]
    assert evaluated == [0, 3, 4, 6, 7]  # the short run's final evaluation at 4 is kept, and not run twice
    refused = run("train.pretrain", f"--out.dir={out}", "--resume", "--train.lr=0.5", "--model.dim=32")
    assert refused.returncode == 2 and "cannot change in a run: train.lr" in refused.stderr
    assert "model.dim (64 in the run, 32 asked)" in refused.stderr and load_trainer_state(out)["step"] == 7


def test_a_run_killed_before_its_first_checkpoint_starts_over(prepared_data, tmp_path):
    """A run folder with run_config.toml and metrics.jsonl but no checkpoint (killed early): a fresh start and
    --resume both start it from the beginning instead of refusing."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.toml").write_text("[train]\nmax_steps = 2\n")
    (out / "metrics.jsonl").write_text('{"step": 0, "val_loss": 6.2}\n')
    base = ["--data.dir=" + str(prepared_data), f"--out.dir={out}", "--model.vocab_size=512", "--model.dim=64",
            "--model.n_layers=1", "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1",
            "--train.max_steps=2", "--train.warmup_steps=1"]
    fresh = run("train.pretrain", *base)
    assert fresh.returncode == 0 and "stopped before its first checkpoint; starting it over" in fresh.stderr
    assert load_trainer_state(out)["step"] == 2
    for name in ("model.safetensors", "trainer_state.json", "training_state.pt"):
        (out / name).unlink(missing_ok=True)
    again = run("train.pretrain", *base, "--resume")
    assert again.returncode == 0 and "holds no checkpoint yet" in again.stderr
    assert load_trainer_state(out)["step"] == 2


@pytest.mark.integration  # a training run on a small tmpfs, ~12 s
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one_and_stops_with_one_line(prepared_data, tmp_path):
    """On a real size-limited file system (tmpfs; skipped where one cannot be mounted): the first checkpoint fits,
    the second does not (a save stages a whole new checkpoint beside the old one). The run stops with exit 2 and
    one error line, leaves no staging behind, and the first checkpoint loads."""
    import shutil
    import subprocess

    common = ["--data.dir=" + str(prepared_data), "--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2",
              "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1", "--train.max_steps=4",
              "--train.warmup_steps=1", "--train.save_interval=1", "--train.eval_interval=100"]
    probe = tmp_path / "probe"
    assert run("train.pretrain", *common, f"--out.dir={probe}", "--train.max_steps=1").returncode == 0
    size = sum(path.stat().st_size for path in probe.rglob("*") if path.is_file())
    mount = tmp_path / "small"
    mount.mkdir()
    kilobytes = int(size * 1.5 / 1024) + 16
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(mount)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({error}); the full-disk test needs root or a "
                    "user namespace")
    try:
        out = mount / "run"
        result = run("train.pretrain", *common, f"--out.dir={out}")
        assert result.returncode == 2, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "could not write a checkpoint" in errors[0] and "Traceback" not in result.stderr
        assert "No space left on device" in errors[0] or "os error 28" in errors[0]
        assert not (out / ".staging").exists() and not (out / ".ready").exists()
        assert load_trainer_state(out)["step"] == 1
        load_model(out)
        shutil.copytree(out, tmp_path / "rescued")  # the run goes on elsewhere from what was kept
    finally:
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)
    rescued = run("train.pretrain", *common, f"--out.dir={tmp_path / 'rescued'}", "--resume")
    assert rescued.returncode == 0, rescued.stderr
    assert load_trainer_state(tmp_path / "rescued")["step"] == 4
