"""experiments.passkey_grid: a cell per (method, length, depth) for the methods that apply to the checkpoint, measure
on a micro checkpoint (every key scored: an oracle gets all right), k of n with the Wilson interval pooled over depths
and per depth, and the study end to end through the engine on a checkpoint trained in the test."""
import re

import pytest
import torch

import eval.passkey as passkey
from data.tokenizer import load_tokenizer
from eval.stats import wilson_interval
from experiments import passkey_grid
from experiments.engine import Context, Records, key, main
from model import Transformer
from model.checkpoint import save_checkpoint, weights_digest
from tests.conftest import micro_config, train_micro_run


@pytest.fixture
def checkpoints(prepared_data, tmp_path):
    tokenizer, folders = load_tokenizer(prepared_data), {}
    for position in ("rope", "alibi"):
        torch.manual_seed(0)
        folders[position] = tmp_path / position
        save_checkpoint(folders[position], Transformer(micro_config(position=position, vocab_size=len(tokenizer),
                                                                    max_seq_len=16)), tokenizer, {"trained_seq_len": 16})
    return folders


def grid(checkpoint, out, **changes):
    return passkey_grid.Settings(**{"checkpoint": str(checkpoint), "lengths": ["10x", "320"], "depths": [0.0, 1.0],
                                    "trials": 2, "dtype": "float32", "out": str(out), **changes})


def test_a_cell_per_method_length_and_depth_where_the_method_applies(checkpoints, tmp_path):
    declared = passkey_grid.cells(grid(checkpoints["rope"], tmp_path), Context(tmp_path))
    assert [c["name"] for c in declared[:4]] == ["none@160/d0", "none@160/d1", "none@320/d0", "none@320/d1"]
    assert {c["method"] for c in declared} == {"none", "yarn", "selfextend", "sinks"} and len(declared) == 16
    assert all(c["checkpoint"] == weights_digest(checkpoints["rope"]) and c["trained"] == 16 for c in declared)
    assert key(declared[0]) == key({**declared[0], "local": {"checkpoint": "elsewhere"}})
    alibi = passkey_grid.cells(grid(checkpoints["alibi"], tmp_path), Context(tmp_path))
    assert "yarn" not in {c["method"] for c in alibi} and "none" in {c["method"] for c in alibi}  # RoPE scaling


def test_measure_scores_every_key_under_the_method(checkpoints, tmp_path, monkeypatch):
    cell = next(c for c in passkey_grid.cells(grid(checkpoints["rope"], tmp_path), Context(tmp_path))
                if c["name"] == "yarn@320/d1")
    tokenizer = load_tokenizer(checkpoints["rope"])

    def oracle(model, ids, new_tokens, **kwargs):  # reads the key from the prompt, as a model that retrieves would
        assert model.config.rope_scaling["factor"] == 20  # the method set for the length: 320 / 16
        found = re.search(r"The pass key is (\d+)", tokenizer.decode(ids)).group(1)
        return iter(tokenizer.encode(f" {found}.", add_special_tokens=False))

    monkeypatch.setattr(passkey, "generate_tokens", oracle)
    record = passkey_grid.measure(cell, Context(tmp_path, 1, "cpu"))
    assert record["accuracy"] == 1.0 and record["trials"] == 2 and len(record["answers"]) == 2
    assert record["length"] == 320 and record["depth"] == 1.0 and record["method"] == "yarn"
    assert record["prompt_tokens"] <= 320


def test_the_report_pools_depths_with_a_wilson_interval(tmp_path):
    cells = [{"name": f"{m}@64/d{d:g}", "method": m, "length": 64, "depth": d, "trained": 16}
             for m in ("none", "yarn") for d in (0.0, 1.0)]
    correct = {("none", 0.0): 0, ("none", 1.0): 1, ("yarn", 0.0): 5, ("yarn", 1.0): 4}
    stored = {key(c): {"record": {"method": c["method"], "length": 64, "depth": c["depth"], "trials": 5,
                                  "accuracy": correct[(c["method"], c["depth"])] / 5}, "seconds": 1.0} for c in cells}
    invocation = {"command": "python -m x", "machine": "m", "where": "w", "wall_s": 4.0}
    passkey_grid.report(Records(grid("ckpt", tmp_path, trials=5), tmp_path, cells, stored, [invocation]))
    report = (tmp_path / "report.md").read_text()
    assert f"| none | 1 of 10, {wilson_interval(1, 10).format(2)} |" in report  # pooled over the two depths
    assert f"| yarn | 9 of 10, {wilson_interval(9, 10).format(2)} |" in report
    assert f"| yarn, depth 1 | 4 of 5, {wilson_interval(4, 5).format(2)} |" in report
    assert "| none, depth 0 | 0 of 5, 0.00 [0.00, 0.43] |" in report and (tmp_path / "passkey.png").exists()


@pytest.mark.integration
def test_the_grid_end_to_end_on_a_trained_checkpoint(prepared_data, tmp_path):
    run = train_micro_run(prepared_data, tmp_path / "run")
    out = tmp_path / "grid"
    argv = ["--checkpoint", str(run), "--methods", "none,yarn", "--lengths", "10x,20x", "--depths", "0,0.5,1",
            "--trials", "2", "--out", str(out), "--workers", "1", "--threads", "1"]
    assert main("experiments.passkey_grid", argv) == 0
    report = (out / "report.md").read_text()
    assert "## Per method and prompt length, pooled over depths" in report and "| method | 160 | 320 |" in report
    assert re.search(r"\| yarn \| \d of 6, 0\.\d\d \[0\.\d\d, [01]\.\d\d\] \| \d of 6", report)
    assert "| none, depth 0.5 |" in report and "Reproduce: `python -m experiments.passkey_grid" in report
    assert len(list((out / "records").glob("*.json"))) == 12 and (out / "passkey.png").exists()
    assert main("experiments.passkey_grid", ["--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == report
