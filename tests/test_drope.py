"""DroPE (train.extend --method drope): RoPE dropped from a trained checkpoint, every weight kept, then a short
recalibration as NoPE; it records what it dropped, takes its budget as a share of pretraining, and resumes."""

import re

import pytest
import torch

from model.checkpoint import load_config, load_trainer_state, load_weights_into
from model.config import ModelConfig
from model.transformer import Transformer
from train.extend import dropped, recalibration_steps
from train.extend import main as extend
from train.pretrain import main as pretrain

BASE = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4", "--model.n_kv_heads=2",
        "--model.max_seq_len=16", "--train.batch_size=4", "--train.eval_batches=2", "--train.dtype=float32"]


@pytest.fixture(scope="module")
def rope_run(prepared_data, tmp_path_factory):
    """A RoPE checkpoint trained for 40 steps of 4 x 16 tokens (2,560 tokens), with QK-norm in its first layer."""
    out = tmp_path_factory.mktemp("drope") / "rope"
    assert pretrain([*BASE, f"--data.dir={prepared_data}", "--train.max_steps=40", "--train.warmup_steps=4", "--model.qk_norm=[true, false]",
                     f"--out.dir={out}"]) == 0
    return out


def test_the_dropped_model_is_a_nope_model_with_the_same_weights(rope_run):
    """The switch itself: the checkpoint's weights load into the NoPE config unchanged (same names and shapes), and
    that model equals a NoPE model built from scratch with those weights; with RoPE it computed something else."""
    base = load_config(rope_run)
    config = ModelConfig.from_dict(dropped(base.to_dict()))
    assert config.position == "none" and config.rope_scaling is None and config.qk_norm == [True, False]
    switched = load_weights_into(Transformer(config), rope_run).eval()
    nope = Transformer(ModelConfig(**{**base.to_dict(), "position": "none", "position_args": {}})).eval()
    nope.load_state_dict(Transformer.state_dict(load_weights_into(Transformer(base), rope_run)))
    idx = torch.randint(0, 512, (2, 40))  # past the trained length too
    with torch.no_grad():
        assert torch.equal(switched(idx)[0], nope(idx)[0])
        rope = load_weights_into(Transformer(base), rope_run).eval()
        assert (rope(idx)[0] - switched(idx)[0]).abs().max() > 1e-3


def test_drope_recalibrates_for_a_share_of_pretraining_and_records_it(rope_run, tmp_path):
    """1% of 2,560 pretraining tokens at 4 x 16 per step is 1 step; --recalibration 0.1 gives 4 steps; the loss at
    the end is below the dropped model's before recalibration, and the state records the dropped settings."""
    assert recalibration_steps(0.01, 2560, 64) == 1 and recalibration_steps(0.1, 2560, 64) == 4
    out = tmp_path / "drope"
    assert extend(["--checkpoint", str(rope_run), "--method", "drope", "--recalibration", "0.1",
                   "--train.lr=3e-3", "--train.eval_interval=4", "--train.eval_batches=2", "--train.dtype=float32",
                   f"--out.dir={out}"]) == 0
    state = load_trainer_state(out)
    assert state["extension_method"] == "drope" and state["training_window"] == 16
    assert state["tokens_seen"] == 4 * 4 * 16 and state["recalibration_share"] == pytest.approx(0.1)
    assert state["dropped_position"]["position"] == "rope" and state["dropped_position"]["rope_theta"] == 10000.0
    config = load_config(out)
    assert config.position == "none" and config.max_seq_len == 16 and config.qk_norm == [True, False]
    assert state["val_loss"] < state["initial_val_loss"]  # step 0: the dropped model, not yet recalibrated


def test_drope_resumes(rope_run, tmp_path):
    """A recalibration stopped after 2 of its steps and resumed to 4 ends with the weights of one run straight to 4."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    common = ["--checkpoint", str(rope_run), "--method", "drope", "--train.dtype=float32", "--train.eval_batches=1",
              "--train.save_interval=2", "--train.eval_interval=100"]
    assert extend([*common, "--train.max_steps=4", f"--out.dir={straight}"]) == 0
    assert extend([*common, "--train.max_steps=2", f"--out.dir={resumed}"]) == 0
    assert extend([*common, "--train.max_steps=4", f"--out.dir={resumed}", "--resume"]) == 0
    one = load_weights_into(Transformer(load_config(straight)), straight).state_dict()
    two = load_weights_into(Transformer(load_config(resumed)), resumed).state_dict()
    assert load_trainer_state(resumed)["step"] == 4
    assert all(torch.allclose(one[name], two[name], atol=1e-6) for name in one)


@pytest.mark.parametrize("flags, message", [
    (["--rope-scaling", "yarn", "--rope-factor", "2"], "drope removes RoPE"),
    (["--recalibration", "1.5"], r"in \(0, 1\]"),
])
def test_bad_drope_options_are_named(rope_run, flags, message, capsys):
    assert extend(["--checkpoint", str(rope_run), "--method", "drope", *flags]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_drope_refuses_checkpoints_of_other_encodings(prepared_data, tmp_path, capsys):
    out = tmp_path / "alibi"
    assert pretrain([*BASE, f"--data.dir={prepared_data}", "--train.max_steps=1", "--model.position=alibi",
                     f"--out.dir={out}"]) == 0
    assert extend(["--checkpoint", str(out), "--method", "drope"]) == 2
    assert "drops RoPE from RoPE checkpoints" in capsys.readouterr().err
    assert extend(["--checkpoint", str(out), "--rope-scaling", "yarn", "--rope-factor", "2",
                   "--recalibration", "0.1"]) == 2
    assert "--recalibration sets --method drope's budget" in capsys.readouterr().err
