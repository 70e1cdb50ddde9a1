"""experiments.sweep: a micro sweep end to end, the choice against hand-made losses, and bad input."""
import json
import math

import pytest

from experiments.sweep import choose, main, write_sweep
from tests.conftest import ROOT
from tests.test_compare import MICRO


@pytest.mark.integration  # four micro comparisons, ~40 s
def test_micro_sweep_end_to_end(small_text_file, tmp_path):
    out = tmp_path / "sweep"
    overrides = [o for o in MICRO if not o.startswith(("--compare.methods", "--compare.lengths", "--compare.seeds"))]
    args = ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick", "--out", str(out),
            "--values", "1e-3,3e-3", f"--compare.source={small_text_file}", "--compare.val_fraction=0.3",
            "--compare.seeds=1,2", "--compare.workers=1", '--compare.encodings=["alibi", "rope"]', *overrides]
    assert main(args) == 0
    record = json.loads((out / "sweep.json").read_text())
    assert record["default"] == "3e-3" and set(record["encodings"]) == {"alibi", "rope"}
    for found in record["encodings"].values():
        assert set(found["loss"]) == {"1e-3", "3e-3"} and found["chosen"] in ("1e-3", "3e-3")
        assert all(set(by_value["seeds"]) == {"1", "2"} for by_value in found["loss"].values())
    runs = json.loads((out / "lr=1e-3" / "results.json").read_text())
    # the preset's own rate for rope ([compare.train_settings]) would override every swept value: the sweep drops it
    trained = json.loads((out / "lr=1e-3" / "runs" / "rope" / "seed1" / "trainer_state.json").read_text())
    assert trained["run_config"]["train"]["lr"] == pytest.approx(1e-3)
    assert runs["settings"]["lengths"] == [16]  # 1x only: the choice never looks at longer lengths
    assert "| encoding | train.lr = 1e-3 | train.lr = 3e-3 (preset) |" in (out / "sweep.md").read_text()
    # the data prepared once, in OUT/data: every value trains and scores the same tokens
    for name in ("meta.json", "train.bin", "val.bin", "tokenizer.json"):
        shared = (out / "data" / name).read_bytes()
        assert all((out / value / "data" / name).read_bytes() == shared for value in ("lr=1e-3", "lr=3e-3"))
    assert main(args) == 0  # a re-run trains nothing and writes the same numbers
    assert json.loads((out / "sweep.json").read_text())["encodings"] == record["encodings"]


def test_the_choice_is_the_lowest_mean_only_where_the_paired_difference_lies_below_zero():
    # seeds differ much between them (the same for every value), so only pairing by seed separates 1e-2 from 3e-3
    clear = {"1e-3": {1: 4.30, 2: 4.60, 3: 4.10}, "3e-3": {1: 4.20, 2: 4.50, 3: 4.00},
             "1e-2": {1: 4.10, 2: 4.41, 3: 3.90}}
    chosen = choose(clear, "3e-3")
    assert chosen["best"] == "1e-2" and chosen["chosen"] == "1e-2" and chosen["verdict"].startswith("better")
    assert chosen["difference"].high < 0 and math.isclose(chosen["difference"].mean, -0.0967, abs_tol=1e-3)
    noisy = {"3e-3": {1: 4.20, 2: 4.50, 3: 4.00}, "1e-2": {1: 4.25, 2: 4.30, 3: 4.01}}
    chosen = choose(noisy, "3e-3")
    assert chosen["best"] == "1e-2" and chosen["chosen"] == "3e-3" and "within noise" in chosen["verdict"]


def test_the_table_lists_every_value_and_marks_the_preset(tmp_path):
    losses = {"1e-3": {"rope": {1: 4.3, 2: 4.6}}, "3e-3": {"rope": {1: 4.2, 2: 4.5}}}
    write_sweep(tmp_path, "train.lr", ["1e-3", "3e-3"], "3e-3", losses, "python -m experiments.sweep ...")
    text = (tmp_path / "sweep.md").read_text()
    assert "| rope | 4.450 [2.544, 6.356] | 4.350 [2.444, 6.256] | 3e-3 |" in text
    assert "the preset's value is best" in text


@pytest.mark.parametrize("argv, message", [
    (["--values", "3e-3"], "at least two values"),
    (["--values", "1e-3,1e-2", "--preset", "quick"], "must include the preset's own train.lr"),
    (["--values", "1e-3,3e-3", "--bogus=1"], "unknown arguments"),
])
def test_bad_sweeps_are_refused_with_the_fix(argv, message, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "s")]) == 2
    assert message in capsys.readouterr().err
