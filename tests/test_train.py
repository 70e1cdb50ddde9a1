"""The training loop: loss goes down, resume continues the same curve, out-dir protection."""
import json

import pytest
import torch

from data.batches import PretrainBatches
from data.tokenizer import load_tokenizer
from errors import ConfigError
from model import Transformer
from model.checkpoint import load_model, load_trainer_state
from train.config import load_run_config
from train.loop import Training, TrainingInterrupted, learning_rate, run_training


def make_config(prepared_data, out, *extra):
    return load_run_config(
        None,
        [
            f"--data.dir={prepared_data}",
            f"--out.dir={out}",
            "--model.vocab_size=512",
            "--model.dim=64",
            "--model.n_layers=2",
            "--model.n_heads=4",
            "--model.n_kv_heads=2",
            "--model.max_seq_len=64",
            "--train.batch_size=4",
            "--train.max_steps=12",
            "--train.warmup_steps=2",
            "--train.log_interval=1",
            "--train.eval_interval=4",
            "--train.eval_batches=2",
            "--train.dtype=float32",
            *extra,
        ],
    )


def train(config, prepared_data, resume=False, batches=None):
    batches = batches or PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
    return run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(prepared_data), resume=resume))


def losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


class InterruptAt:
    """Batches that raise KeyboardInterrupt (like Ctrl-C) when a given step asks for data."""

    def __init__(self, batches, step):
        self.batches, self.step = batches, step

    def train_batch(self, step, micro_step=0):
        if step == self.step:
            raise KeyboardInterrupt
        return self.batches.train_batch(step, micro_step)

    def val_batches_iter(self):
        return self.batches.val_batches_iter()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_continues_the_same_loss_curve(prepared_data, tmp_path, dtype):
    """Bit-exact on CPU in fp32; with bf16 autocast too, on the same machine (deterministic CPU kernels)."""
    straight = make_config(prepared_data, tmp_path / "straight", f"--train.dtype={dtype}")
    train(straight, prepared_data)

    interrupted = make_config(prepared_data, tmp_path / "resumed", f"--train.dtype={dtype}")
    batches = PretrainBatches(prepared_data, 64, 4, interrupted.train.seed, 2)
    with pytest.raises(TrainingInterrupted):
        train(interrupted, prepared_data, batches=InterruptAt(batches, 7))
    assert load_trainer_state(tmp_path / "resumed")["step"] == 7
    train(interrupted, prepared_data, resume=True)

    expected, got = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert sorted(expected) == sorted(got) == list(range(1, 13))
    assert [got[s] for s in range(1, 13)] == [expected[s] for s in range(1, 13)]  # bit-exact
    a, b = load_model(tmp_path / "straight"), load_model(tmp_path / "resumed")
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


def test_training_reduces_loss_and_records_state(prepared_data, tmp_path):
    config = make_config(prepared_data, tmp_path / "run", "--train.max_steps=200", "--train.lr=1e-2", "--train.eval_interval=50")
    result = train(config, prepared_data)
    # from about ln(512) = 6.24 nats at initialisation; the run ends near 5.3, so a drop of 0.7 leaves room for
    # tokenizer versions (the split of the corpus) without passing a trainer that does not learn
    assert result.final_val_loss < result.initial_val_loss - 0.7
    state = load_trainer_state(tmp_path / "run")
    assert state["step"] == 200 and state["trained_seq_len"] == 64
    assert state["tokens_seen"] == 200 * 4 * 64
    assert (tmp_path / "run" / "run_config.toml").exists()


def test_existing_run_is_not_overwritten_without_permission(prepared_data, tmp_path):
    config = make_config(prepared_data, tmp_path / "run", "--train.max_steps=2")
    train(config, prepared_data)
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(config, prepared_data)
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before
    bigger = make_config(prepared_data, tmp_path / "run", "--train.max_steps=4", "--model.dim=128")
    with pytest.raises(ConfigError, match=r"model config differs .* \['dim', 'ffn_dim'\]"):
        train(bigger, prepared_data, resume=True)


def test_learning_rate_schedule():
    config = load_run_config(None, ["--train.lr=1.0", "--train.warmup_steps=10", "--train.max_steps=110",
                                    "--train.min_lr_ratio=0.1"])
    assert learning_rate(0, config) == pytest.approx(0.1)
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(60, config) == pytest.approx(0.55)
    assert learning_rate(110, config) == pytest.approx(0.1)
    cycles = load_run_config(None, ["--train.lr=1.0", "--train.warmup_steps=10", "--train.max_steps=310",
                                    "--train.min_lr_ratio=0.1", "--train.lr_cycle=100"])
    for step in (9, 60, 109):  # the first cycle is the single-cycle schedule of a 110-step run
        assert learning_rate(step, cycles) == pytest.approx(learning_rate(step, config))
    assert learning_rate(110, cycles) == pytest.approx(1.0) and learning_rate(160, cycles) == pytest.approx(0.55)
    assert learning_rate(309, cycles) == pytest.approx(learning_rate(109, config))


def test_init_starts_from_the_checkpoint_weights(prepared_data, tmp_path):
    from train.pretrain import main

    base = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
            "--model.n_kv_heads=2", "--model.max_seq_len=64", "--train.batch_size=4", "--train.warmup_steps=2",
            "--train.eval_interval=5", "--train.eval_batches=2", "--train.dtype=float32", f"--data.dir={prepared_data}"]
    assert main([*base, "--train.max_steps=20", f"--out.dir={tmp_path / 'base'}"]) == 0
    finished = load_trainer_state(tmp_path / "base")
    # The fine-tune gives no [model] keys: shape comes from the checkpoint, and step 0 is its final state.
    assert main(["--checkpoint", str(tmp_path / "base"), "--train.max_steps=2", "--train.eval_batches=2",
                 "--train.batch_size=4", "--train.dtype=float32", f"--data.dir={prepared_data}",
                 f"--out.dir={tmp_path / 'tuned'}"]) == 0
    tuned = load_trainer_state(tmp_path / "tuned")
    assert tuned["initial_val_loss"] == pytest.approx(finished["val_loss"], abs=1e-9)
    assert tuned["init"] == str(tmp_path / "base")
    assert tuned["run_config"]["model"]["dim"] == 64
    assert main(["--checkpoint", str(tmp_path / "base"), "--model.dim=128", f"--data.dir={prepared_data}",
                 f"--out.dir={tmp_path / 'wrong'}"]) == 2


def test_extend_records_the_scaling_and_original_length(prepared_data, tmp_path):
    from model.checkpoint import trained_length
    from train.extend import main as extend
    from train.pretrain import main as pretrain

    base = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
            "--model.n_kv_heads=2", "--model.max_seq_len=16", "--train.batch_size=4", "--train.eval_batches=2",
            "--train.dtype=float32", f"--data.dir={prepared_data}"]
    assert pretrain([*base, "--train.max_steps=10", f"--out.dir={tmp_path / 'short'}"]) == 0
    out = tmp_path / "long"
    assert extend(["--checkpoint", str(tmp_path / "short"), "--rope-scaling", "yarn", "--rope-factor", "4", "--train.max_steps=4",
                   "--train.dtype=float32", "--train.eval_batches=1", f"--out.dir={out}"]) == 0
    model = load_model(out)
    assert model.config.max_seq_len == 64
    assert model.config.rope_scaling["rope_type"] == "yarn" and model.config.rope_scaling["factor"] == 4.0
    assert model.config.rope_scaling["original_max_position_embeddings"] == 16
    state = load_trainer_state(out)
    assert state["task"] == "extend" and state["extended_from"] == 16 and trained_length(out) == 64
    assert state["tokens_seen"] == 4 * 4 * 64
    # Step 0 of the extension is the short model with YaRN at inference time, at the new length.
    short = load_model(tmp_path / "short").with_rope_scaling({"rope_type": "yarn", "factor": 4.0})
    batches = PretrainBatches(prepared_data, 64, 4, 1337, 1)
    from train.loop import evaluate_loss

    assert evaluate_loss(short, batches, torch.device("cpu"), None) == pytest.approx(state["initial_val_loss"], abs=1e-6)
    # --resume continues the extension where it stopped (here: asked for 2 more steps after the first 4).
    assert extend(["--checkpoint", str(tmp_path / "short"), "--rope-scaling", "yarn", "--rope-factor", "4",
                   "--train.max_steps=6", "--train.dtype=float32", "--train.eval_batches=1", f"--out.dir={out}",
                   "--resume"]) == 0
    resumed = load_trainer_state(out)
    assert resumed["step"] == 6 and resumed["tokens_seen"] == 6 * 4 * 64 and resumed["extended_from"] == 16
    alibi = tmp_path / "alibi"
    assert pretrain([*base, "--model.position=alibi", "--train.max_steps=1", f"--out.dir={alibi}"]) == 0
    assert extend(["--checkpoint", str(alibi), "--rope-scaling", "yarn", "--rope-factor", "2"]) == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_config_and_seed_give_the_same_checkpoint(prepared_data, tmp_path, dtype):
    """The determinism guarantee (docs/guide/training.md): same machine, same config and seed -> identical weight files."""
    for name in ("first", "second"):
        train(make_config(prepared_data, tmp_path / name, "--train.max_steps=6", f"--train.dtype={dtype}",
                          "--model.dropout=0.1"), prepared_data)
    assert (tmp_path / "first" / "model.safetensors").read_bytes() == (tmp_path / "second" / "model.safetensors").read_bytes()
    other_seed = make_config(prepared_data, tmp_path / "third", "--train.max_steps=6", f"--train.dtype={dtype}",
                             "--model.dropout=0.1", "--train.seed=7")
    train(other_seed, prepared_data)
    assert (tmp_path / "third" / "model.safetensors").read_bytes() != (tmp_path / "first" / "model.safetensors").read_bytes()


def test_position_parameters_get_their_own_optimizer_group(prepared_data, tmp_path):
    """T5's bucket table: the encoding's measured defaults, overridable by train.position_*; others keep theirs."""
    from train.loop import build_optimizer

    config = make_config(prepared_data, tmp_path / "a", "--model.position=t5")
    model = Transformer(config.model)
    groups = build_optimizer(model, config, torch.device("cpu")).param_groups
    assert [len(group["params"]) for group in groups] == [len([p for p in model.parameters() if p.dim() >= 2]) - 1,
                                                         len([p for p in model.parameters() if p.dim() < 2]), 1]
    assert groups[2]["params"][0] is model.position.relative_attention_bias.weight
    assert (groups[2]["lr_scale"], groups[2]["weight_decay"]) == (10.0, 0.0)
    config = make_config(prepared_data, tmp_path / "b", "--model.position=t5", "--train.position_lr_scale=2.0",
                         "--train.position_weight_decay=0.05")
    groups = build_optimizer(Transformer(config.model), config, torch.device("cpu")).param_groups
    assert (groups[2]["lr_scale"], groups[2]["weight_decay"]) == (2.0, 0.05)
    assert len(build_optimizer(Transformer(make_config(prepared_data, tmp_path / "c").model), config,
                               torch.device("cpu")).param_groups) == 2  # rope has no position parameters
    # The schedule reaches every group through its scale.
    config = make_config(prepared_data, tmp_path / "d", "--model.position=t5", "--train.max_steps=2",
                         "--train.warmup_steps=1")
    train(config, prepared_data)
    from model.checkpoint import load_training_state

    saved = load_training_state(tmp_path / "d")["optimizer"]["param_groups"]
    assert saved[2]["lr"] == pytest.approx(10 * saved[0]["lr"])


def test_warmup_longer_than_training_is_pointed_out(prepared_data, tmp_path, capsys):
    from train.pretrain import main as pretrain

    assert pretrain(["--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
                     "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1",
                     "--train.max_steps=3", "--train.warmup_steps=10", f"--data.dir={prepared_data}",
                     f"--out.dir={tmp_path / 'run'}"]) == 0
    assert "train.warmup_steps (10) >= train.max_steps (3)" in capsys.readouterr().err


def test_each_encoding_of_a_hybrid_gets_its_own_group_and_constraints_hold(prepared_data, tmp_path):
    """A T5 + KERPLE layer hybrid: two position groups, each with its encoding's settings; after real training steps
    KERPLE's r1, r2 are still >= 0.01 although a large learning rate pushes some below it."""
    from train.loop import build_optimizer

    config = make_config(prepared_data, tmp_path / "run", "--model.position=t5",
                         '--model.position_layers=["t5", "kerple"]', "--train.max_steps=6", "--train.lr=0.5")
    model = Transformer(config.model)
    groups = build_optimizer(model, config, torch.device("cpu")).param_groups
    assert len(groups) == 4
    assert groups[2]["params"] == [model.position.relative_attention_bias.weight]
    assert groups[3]["params"] == [model.layer_positions["kerple"].r1, model.layer_positions["kerple"].r2]
    assert (groups[2]["lr_scale"], groups[3]["lr_scale"]) == (10.0, 1.0)
    train(config, prepared_data)
    kerple = load_model(tmp_path / "run").layer_positions["kerple"]
    assert kerple.r1.min() >= 0.01 and kerple.r2.min() >= 0.01
    assert (kerple.r2 == 0.01).any()  # the projection did act: some r2 would be below 0.01 without it


def test_a_run_saved_before_newer_model_settings_resumes(prepared_data, tmp_path):
    """trainer_state.json written before model settings were added (here: position_layers, attention_window) and
    before model.position_args (the encodings' settings as flat keys, rope_fraction and rope_p for this RoPE run,
    t5_max_distance for an encoding it does not use) still resumes: missing settings take their defaults, the flat
    ones are read as the position_args they were."""
    out = tmp_path / "run"
    train(make_config(prepared_data, out, "--train.max_steps=2"), prepared_data)
    state_path = out / "trainer_state.json"
    state = json.loads(state_path.read_text())
    model = state["run_config"]["model"]
    for key in ("position_args", "position_layers", "attention_window"):
        del model[key]
    model.update(rope_fraction=1.0, rope_p=1.0, t5_max_distance=128)
    state_path.write_text(json.dumps(state))
    train(make_config(prepared_data, out, "--train.max_steps=4"), prepared_data, resume=True)
    assert load_trainer_state(out)["step"] == 4


def test_log_lines_show_the_step_out_of_the_total_and_an_eta(prepared_data, tmp_path, capsys):
    import re

    config = make_config(prepared_data, tmp_path / "run", "--train.max_steps=6", "--train.log_interval=2")
    train(config, prepared_data)
    lines = [line for line in capsys.readouterr().out.splitlines() if "| loss " in line]
    assert [line.split("|")[0].strip() for line in lines] == ["step     2/6", "step     4/6", "step     6/6"]
    assert all(re.search(r"\| eta \d+m\d\ds$", line) for line in lines) and lines[-1].endswith("eta 0m00s")


def test_a_stop_check_ends_training_at_an_evaluation_step_with_that_steps_checkpoint(prepared_data, tmp_path):
    asked = []

    def stop_when(model, step):
        asked.append((step, model.training))
        return "enough" if step == 8 else None

    out = tmp_path / "run"
    config = make_config(prepared_data, out)  # max_steps 12, eval_interval 4
    batches = PretrainBatches(prepared_data, 64, 4, config.train.seed, 2)
    result = run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(prepared_data),
                          stop_when=stop_when))
    assert asked == [(4, True), (8, True)]  # not at step 0, and only at evaluation steps
    assert result.steps == 8 and result.stopped == "enough" and load_trainer_state(out)["step"] == 8
    assert load_trainer_state(out)["stopped"] == {"step": 8, "reason": "enough"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"step": 8, "stopped": "enough"} in rows and max(row["step"] for row in rows) == 8
    resumed = run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(prepared_data),
                           resume=True))  # a stopped run resumed goes on to max_steps and is not stopped any more
    assert resumed.steps == 12 and resumed.stopped is None and "stopped" not in load_trainer_state(out)


def test_a_step_that_lost_its_backward_stops_training_at_once(prepared_data, tmp_path, monkeypatch):
    """The fused loss's backward returning no gradients (what a compiled step did on CUDA with torch 2.11) would
    train nothing and save the initial model; the first step's check stops it with a message naming compile."""
    from model.loss import _ChunkedLinearCrossEntropy

    monkeypatch.setattr(_ChunkedLinearCrossEntropy, "backward",
                        staticmethod(lambda ctx, grad: (None,) * 4))
    with pytest.raises(RuntimeError, match="every gradient None or zero .*--train.compile=false"):
        train(make_config(prepared_data, tmp_path / "run"), prepared_data)

