"""experiments.sweep on the study engine: its settings, each value's comparison, the choice rule and the table from
hand-made records (as a migrated record holds them), and (integration tier) a micro sweep end to end."""
import json
import math

import pytest

from commands import results_json
from errors import ConfigError
from eval.stats import t_interval
from eval.verdicts import sweep_choice
from experiments import compare, sweep
from experiments.engine import key, load_records, main
from experiments.render import cell
from tests.conftest import ROOT

QUICK = {"compare": {"encodings": ["alibi", "rope"], "train_settings": {"rope": {"lr": 6e-3, "warmup_steps": 5}}},
         "model": {"max_seq_len": 64}, "train": {"lr": 3e-3, "max_steps": 10}}


@pytest.mark.parametrize("values, key, message", [
    (["3e-3"], "train.lr", "at least two values"),
    (["1e-3", "1e-2"], "train.lr", "the preset's own train.lr (0.003)"),
    (["1e-3", "3e-3"], "compare.seeds", "a [model] or [train] setting"),
    (["1e-3", "3e-3"], "train.warmup_steps", "the preset's own train.warmup_steps (None)"),
])
def test_a_sweep_needs_two_values_one_of_them_the_presets_own(values, key, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        sweep.Settings(key=key, values=values, **QUICK)


def test_each_value_is_a_comparison_at_1x_without_the_encodings_own_value_of_the_key():
    settings = sweep.Settings(values=[1e-3, "3e-3"], **QUICK)
    assert settings.default == "3e-3"  # a value given as text is parsed, and the table says it as given
    found = sweep.comparison(settings, 1e-3)
    assert found.train["lr"] == 1e-3 and found.lengths == ["1x"] and found.methods == [] and found.snapshots == []
    assert found.probes == [] and found.tasks == [] and found.encodings == ["alibi", "rope"]
    assert found.train_settings == {"rope": {"warmup_steps": 5}}  # the preset's own rope rate would override 1e-3
    assert sweep.comparison(sweep.Settings(key="model.dim", values=[32, 64], **{**QUICK, "model": {"dim": 64}}),
                            32).train_settings == QUICK["compare"]["train_settings"]  # another key keeps it


def test_the_choice_is_the_lowest_mean_only_where_the_paired_difference_lies_below_zero():
    # the seeds differ much between them (the same for every value): only pairing by seed separates 1e-2 from 3e-3
    clear = t_interval([4.10 - 4.20, 4.41 - 4.50, 3.90 - 4.00])
    assert sweep_choice("1e-2", "3e-3", clear) == ("1e-2", "better than the preset's value")
    assert math.isclose(clear.mean, -0.0967, abs_tol=1e-3) and clear.high < 0
    noisy = t_interval([4.25 - 4.20, 4.30 - 4.50, 4.01 - 4.00])
    assert sweep_choice("1e-2", "3e-3", noisy) == ("3e-3", "within noise of the preset's value")
    assert sweep_choice("3e-3", "3e-3", None) == ("3e-3", "the preset's value is best")


def write_sweep(out, values, losses):
    """A sweep folder of hand-made records: value -> encoding -> seed -> the 1x loss, where a comparison keeps it."""
    cells = []
    (out / "records").mkdir(parents=True)
    for value in values:
        for encoding, seeds in losses[value].items():
            for seed, loss in seeds.items():
                cell = {"name": f"train.lr={value}/{encoding}-seed{seed}", "kind": "model", "encoding": encoding,
                        "seed": seed}
                (out / "records" / f"{key(cell)}.json").write_text(results_json(
                    {"key": key(cell), "cell": cell, "record": {"evaluation": {"nll": {"none@64": loss,
                                                                                      "yarn@64": 0.0}}},
                     "seconds": 1.0, "machine": "m"}))
                cells.append(cell)
    settings = {"values": values, **QUICK, "out": str(out)}
    (out / "study.json").write_text(json.dumps({"study": "experiments.sweep", "settings": settings, "cells": cells}))
    (out / "invocations.jsonl").write_text(json.dumps({"command": "python -m experiments.sweep", "machine": "m",
                                                       "where": "here", "wall_s": 60.0}) + "\n")


def test_the_table_lists_every_value_marks_the_preset_and_says_the_choice(tmp_path):
    write_sweep(tmp_path / "s", ["1e-3", "3e-3", "1e-2"], {
        "1e-3": {"rope": {1: 4.3, 2: 4.6, 3: 4.1}, "alibi": {1: 4.3, 2: 4.6, 3: 4.1}},
        "3e-3": {"rope": {1: 4.2, 2: 4.5, 3: 4.0}, "alibi": {1: 4.2, 2: 4.5, 3: 4.0}},
        "1e-2": {"rope": {1: 4.10, 2: 4.41, 3: 3.90}, "alibi": {1: 4.25, 2: 4.30, 3: 4.01}}})
    sweep.report(load_records(sweep.STUDY, tmp_path / "s"))
    text = (tmp_path / "s" / "sweep.md").read_text()
    assert "| encoding | train.lr = 1e-3 | train.lr = 3e-3 (preset) | train.lr = 1e-2 | lowest |" in text
    assert ("| rope | 4.333 [3.708, 4.959] | 4.233 [3.608, 4.859] | 4.137 [3.498, 4.775] | 1e-2 | -0.097 [-0.111, "
            "-0.082] | 1e-2 (better than the preset's value) |") in text  # the difference paired by seed
    assert ("| alibi | 4.333 [3.708, 4.959] | 4.233 [3.608, 4.859] | 4.187 [3.802, 4.572] | 1e-2 | -0.047 [-0.380, "
            "+0.287] | 3e-3 (within noise of the preset's value) |") in text
    assert "its difference from the preset's value (3e-3), paired by seed" in text


@pytest.mark.integration  # a micro sweep: 2 values x 2 encodings x 2 seeds, ~25 s
def test_micro_sweep_end_to_end(small_text_file, tmp_path):
    out = tmp_path / "sweep"
    args = ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick", "--out", str(out),
            "--values", "1e-3,3e-3", "--workers", "1", "--threads", "1", f"--compare.source={small_text_file}",
            "--compare.val_fraction=0.3", "--compare.vocab_size=300", "--compare.eval_tokens=512",
            "--compare.seeds=[1, 2]", '--compare.encodings=["alibi", "rope"]', "--model.dim=32", "--model.n_layers=1",
            "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.max_steps=6",
            "--train.batch_size=4", "--train.eval_interval=3", "--train.eval_batches=1", "--train.log_interval=2"]
    assert main("experiments.sweep", args) == 0
    text = (out / "sweep.md").read_text()
    assert "| encoding | train.lr = 0.001 | train.lr = 0.003 (preset) | lowest |" in text
    choices, against_rope = text.split("## Each encoding less rope, paired by seed")
    assert choices.count("| alibi |") == 1 and choices.count("| rope |") == 1
    assert against_rope.count("| alibi |") == 1 and "| rope |" not in against_rope  # RoPE is the reference
    records = load_records(sweep.STUDY, out)
    assert sorted(cell["name"] for cell, _ in records.done()) == sorted(
        f"train.lr={v}/{e}-seed{s}" for v in ("0.001", "0.003") for e in ("alibi", "rope") for s in (1, 2))
    # quick's own rope rate ([compare.train_settings]) would override every swept value: the sweep leaves it out
    trained = next(cell for cell, _ in records.done() if cell["name"] == "train.lr=0.001/rope-seed1")
    state = json.loads((compare.run_folder(out / "work", trained) / "trainer_state.json").read_text())
    assert state["run_config"]["train"]["lr"] == pytest.approx(1e-3)
    for _, record in records.done():  # 1x only, every value on the one data set
        assert [k.split("@")[1] for k in record["evaluation"]["nll"]] == ["16"] and record["probes"] == {}
    assert len({cell["data"]["digest"] for cell, _ in records.done()}) == 1
    assert main("experiments.sweep", args) == 0  # a rerun measures nothing and writes the same table
    assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["measured"] == 0
    assert (out / "sweep.md").read_text().split("\n")[4:] == text.split("\n")[4:]


def test_each_encoding_is_set_against_rope_paired_by_seed():
    from experiments.sweep import differences

    losses = {"rope": {"1e-3": {1: 3.0, 2: 3.2, 3: 3.1}, "2e-3": {1: 2.9, 2: 3.0, 3: 3.1}},
              "alibi": {"1e-3": {1: 2.8, 2: 3.1, 3: 3.0}, "2e-3": {1: 3.0, 2: 3.2, 3: 3.2}}}
    lines = differences(losses, ["1e-3", "2e-3"], "train.lr")
    row = next(line for line in lines if line.startswith("| alibi |"))
    at_1e3 = t_interval([2.8 - 3.0, 3.1 - 3.2, 3.0 - 3.1])
    at_own_lowest = t_interval([2.8 - 2.9, 3.1 - 3.0, 3.0 - 3.1])  # alibi at 1e-3 against rope at 2e-3
    assert row.startswith(f"| alibi | {cell(at_1e3, 3, signed=True)} |")
    assert row.endswith(f"| {cell(at_own_lowest, 3, signed=True)} (1e-3) |")
    assert "against rope at its own (2e-3)" in "\n".join(lines) and differences({"rope": {}}, [], "x") == []
