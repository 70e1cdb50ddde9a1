"""eval.task_score: a trained checkpoint scored on a task, with model settings changed for the scoring only."""
from __future__ import annotations

import json

import pytest
import torch

from data.tasks import get_task
from errors import CheckpointError, ConfigError
from eval import task_score
from eval.task_score import evaluate
from model import Transformer
from model.checkpoint import save_checkpoint
from tests.conftest import micro_config


def _dape_checkpoint(folder):
    task = get_task("copy")
    model = Transformer(micro_config(position="dape", vocab_size=task.vocab_size, max_seq_len=16)).eval()
    save_checkpoint(folder, model)
    return model, task


def test_scores_equal_the_task_evaluation_and_an_override_reaches_the_model(tmp_path):
    model, task = _dape_checkpoint(tmp_path / "a")
    with torch.no_grad():
        expected = {f"{m}x": evaluate(model, task, m * 16, 32) for m in (1, 2)}
    plain = task_score.score_checkpoints("copy", [str(tmp_path / "a")], [1, 2], 32, [])
    assert plain[str(tmp_path / "a")] == expected

    clipped_config = micro_config(position="dape", vocab_size=task.vocab_size, max_seq_len=16,
                                  position_args={"dape": {"mlp_bias_clip": 3}})
    clipped = Transformer(clipped_config).eval()
    clipped.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected_clipped = evaluate(clipped, task, 32, 32)
    got = task_score.score_checkpoints("copy", [str(tmp_path / "a")], [2], 32,
                                       ["--model.position_args.dape.mlp_bias_clip=3"])
    assert got[str(tmp_path / "a")]["2x"] == expected_clipped
    # a random model scores 0 either way, so the override is checked on the model it builds: the clipped logits
    inputs = task.batch(0, 4, 32).inputs
    changed = task_score.load_changed(str(tmp_path / "a"), ["--model.position_args.dape.mlp_bias_clip=3"]).eval()
    with torch.no_grad():
        assert torch.equal(changed(inputs)[0], clipped(inputs)[0])
        assert not torch.allclose(changed(inputs)[0], model(inputs)[0])


def test_the_command_writes_the_table_and_json(tmp_path, capsys):
    _dape_checkpoint(tmp_path / "a")
    _dape_checkpoint(tmp_path / "b")
    out = tmp_path / "scores.json"
    assert task_score.main(["--task", "copy", "--checkpoint", f"{tmp_path / 'a'},{tmp_path / 'b'}",
                            "--multiples", "1,2", "--count", "16", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mean [95% interval, inside 0..1]" in printed and "2x token accuracy / exact match" in printed
    saved = json.loads(out.read_text())
    assert set(saved["scores"]) == {str(tmp_path / "a"), str(tmp_path / "b")}


def test_refuses_what_is_not_a_model_setting_and_weights_that_do_not_fit(tmp_path):
    _dape_checkpoint(tmp_path / "a")
    with pytest.raises(ConfigError, match="looks like --model.key=value"):
        task_score.main(["--task", "copy", "--checkpoint", str(tmp_path / "a"), "--train.lr=1"])
    with pytest.raises(CheckpointError, match="with --model.dim=32"):
        task_score.score_checkpoints("copy", [str(tmp_path / "a")], [1], 8, ["--model.dim=32"])
