"""Readers and a writer on one checkpoint folder at the same time: a read never modifies the folder, never fails
because a save is in progress, and always sees one save's files (config and weights of the same save)."""
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from model.checkpoint import READY, load_model, load_trainer_state
from tests.conftest import ROOT
from tests.test_crash_safety import ENV, command

pytestmark = pytest.mark.integration  # a writer or a training run in a subprocess, readers in a loop

# Save 300 times in a tight loop; save i has rope_theta 1000 + i, every weight equal to i and trainer_state step i.
WRITER = textwrap.dedent("""
    import sys, torch
    from model import Transformer
    from model.checkpoint import save_checkpoint
    from tests.conftest import micro_config
    for step in range(300):
        model = Transformer(micro_config(rope_theta=1000.0 + step))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float(step))
        save_checkpoint(sys.argv[1], model, trainer_state={"step": step})
""")


def test_readers_see_whole_saves_while_a_writer_saves_in_a_tight_loop(tmp_path):
    out = tmp_path / "run"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], cwd=ROOT, env=ENV)
    try:
        reads, steps, saw_ready = 0, set(), False
        while writer.poll() is None or reads == 0:
            if not (out / "config.json").exists():
                time.sleep(0.001)
                continue
            saw_ready |= (out / READY).exists()
            model = load_model(out)
            step = model.config.rope_theta - 1000.0
            for name, parameter in model.named_parameters():
                assert torch.all(parameter == step), (name, step)  # weights and config from the same save
            assert 0 <= load_trainer_state(out)["step"] <= 299
            steps.add(step)
            reads += 1
        assert writer.wait() == 0
    finally:
        writer.kill()
    assert reads >= 20 and len(steps) >= 5, (reads, len(steps))
    assert load_model(out).config.rope_theta == 1299.0


def test_readers_in_a_loop_against_a_training_run_that_saves_every_step(prepared_data, tmp_path):
    out = tmp_path / "run"
    run = subprocess.Popen(command(prepared_data, out), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        reads, steps = 0, set()
        while run.poll() is None:
            if not (out / "model.safetensors").exists():
                time.sleep(0.005)
                continue
            load_model(out)
            steps.add(load_trainer_state(out)["step"])
            reads += 1
        assert run.wait() == 0, run.stderr.read()[-2000:]
    finally:
        run.kill()
    assert reads >= 10 and len(steps) >= 3, (reads, sorted(steps))
    assert load_trainer_state(out)["step"] == 60
