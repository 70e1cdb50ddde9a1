"""SIGKILL during checkpoint writes: the last complete checkpoint always loads, and --resume ends bit-exact
where an uninterrupted run ends (CPU, float32), with the same loss curve (data order and RNG included)."""
import json
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from model.checkpoint import READY, STAGING, has_checkpoint, load_model, load_trainer_state
from tests.conftest import ROOT
from tests.test_distributed import MICRO

pytestmark = pytest.mark.integration  # SIGKILLed training runs in subprocesses, then resumed

ENV = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def command(prepared_data, out, *extra):
    return [sys.executable, "-m", "train.pretrain", f"--data.dir={prepared_data}", f"--out.dir={out}", *MICRO,
            "--train.max_steps=60", "--train.save_interval=1", "--model.dropout=0.1", *extra]


def curve(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row.get("loss"), row.get("val_loss")) for row in rows]


def saved_step(out):
    try:
        return json.loads((out / "trainer_state.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def wait_for_progress(process, out, beyond, deadline=60.0):
    """Wait until the run has saved a checkpoint past step `beyond`."""
    started = time.monotonic()
    while saved_step(out) <= beyond:
        assert process.poll() is None and time.monotonic() - started < deadline, "the run made no progress"
        time.sleep(0.002)


def kill_during_the_next_write(process, out):
    """Busy-wait until a checkpoint write is under way, then SIGKILL; True if the kill hit a write."""
    while process.poll() is None:
        if (out / STAGING).exists() or (out / READY).exists():
            process.send_signal(signal.SIGKILL)
            process.wait()
            return (out / STAGING).exists() or (out / READY).exists()
    return False


def test_sigkill_while_saving_then_resume_equals_an_uninterrupted_run(prepared_data, tmp_path):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    subprocess.run(command(prepared_data, reference), cwd=ROOT, env=ENV, check=True, capture_output=True)
    rng = random.Random(0)
    hits, steps_seen = 0, []
    for attempt in range(4):
        extra = ["--resume"] if has_checkpoint(crashed) else ["--out.overwrite=true"]
        process = subprocess.Popen(command(prepared_data, crashed, *extra), cwd=ROOT, env=ENV,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_progress(process, crashed, beyond=saved_step(crashed))
        if attempt % 2 == 0:
            hits += kill_during_the_next_write(process, crashed)
        else:  # a random moment, wherever it falls
            time.sleep(rng.uniform(0.0, 0.2))
            process.send_signal(signal.SIGKILL)
            process.wait()
        if has_checkpoint(crashed):
            model = load_model(crashed)  # the last complete checkpoint loads
            assert all(bool(p.isfinite().all()) for p in model.parameters())
            steps_seen.append(load_trainer_state(crashed)["step"])
    assert hits >= 1, "no kill landed inside a checkpoint write"
    assert steps_seen == sorted(steps_seen) and steps_seen[-1] < 60, steps_seen  # killed before the end
    finished = subprocess.run(command(prepared_data, crashed, "--resume"), cwd=ROOT, env=ENV, capture_output=True,
                              text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]
    expected, resumed = load_model(reference), load_model(crashed)
    for (name, a), b in zip(expected.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert curve(crashed) == curve(reference)
