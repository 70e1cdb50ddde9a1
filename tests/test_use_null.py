"""experiments.use_null: the true null by construction (the control against a second control: the same second copies,
other passages at every first copy), one cell measured on a micro checkpoint, and the report's rates on planted
records: a null family, the exact interval of the false-positive rate, and the detection of a known use."""
import numpy as np
import pytest

from data.tokenizer import load_tokenizer
from eval.scoring import score_windows
from eval.use import Placement, null_forwards
from experiments.engine import Context, Records, key
from experiments.use_grid import read_text
from experiments.use_null import Settings, cells, measure
from experiments.use_null_report import null_cells, report
from model.checkpoint import load_model
from model.methods import method_spec
from tests.test_use_grid import checkpoint  # noqa: F401 - the use grid's micro checkpoint (L = 64), a fixture


def micro_cells(checkpoint, text, tmp_path):  # noqa: F811
    settings = Settings(checkpoint=str(checkpoint), texts=[str(text)], methods=["none", "sinks"], length="4x",
                        windows=3, passages=1, distances=["0.5x", "1.25x", "2x"], within=["0.5x"], dtype="float32",
                        out=str(tmp_path / "null"))
    return cells(settings, Context(tmp_path / "null"))


def test_both_controls_hold_the_same_second_copies_and_other_first_copies():
    ids = np.arange(5000) % 997
    placements = [Placement(20, 30, 50), Placement(40, 60, 100)]
    found = null_forwards(ids, 1000, 200, placements, 8, [0, 0])
    control, second = found["control"][0], found["second_control"][0]
    window = ids[1000:1201]
    outside = [i for i in range(201) if not any(start <= i < start + 8 for p in placements for start in (p.first, p.second))]
    assert (control[outside] == window[outside]).all() and (second[outside] == window[outside]).all()
    for p in placements:  # the second copy is the same passage in both; neither first copy repeats it
        assert (control[p.second : p.second + 8] == second[p.second : p.second + 8]).all()
        assert not (control[p.first : p.first + 8] == control[p.second : p.second + 8]).all()
        assert not (second[p.first : p.first + 8] == second[p.second : p.second + 8]).all()
        assert not (control[p.first : p.first + 8] == second[p.first : p.first + 8]).all()


def test_a_null_cell_scores_both_controls_and_no_positive_control(checkpoint, small_text_file, tmp_path):  # noqa: F811
    found = micro_cells(checkpoint, small_text_file, tmp_path)
    assert len(found) == 6 and all(c["null"] and c["method"] in ("none", "sinks") for c in found)
    cell = found[0]
    record = measure(cell, Context(tmp_path, 1))
    assert set(record["passages"]) == {"control", "second_control"}
    ids = read_text(small_text_file, load_tokenizer(checkpoint))
    placements = [Placement(*p) for p in cell["placements"]]
    forwards = null_forwards(ids, cell["start"], 256, placements, cell["span"], [0, 0])
    view = load_model(checkpoint).eval().under(method_spec("none"), 256, 64)
    for kind in ("control", "second_control"):
        losses = score_windows(view, forwards[kind])[0]
        expected = [losses[p.second : p.second + cell["span"] - 1].mean() for p in placements]
        assert record["passages"][kind] == pytest.approx(expected, abs=1e-5)


def planted(tmp_path, shift=0.0, windows=6, distances=(10, 20, 30, 40)) -> Records:
    """Null records of 2 methods x 4 distances over `windows` windows: each passage's second-control NLL is its
    control's plus noise (sd 0.02) plus `shift`."""
    rng = np.random.default_rng(0)
    found, stored = [], {}
    for method in ("none", "yarn"):
        for window in range(windows):
            cell = {"name": f"t/w{window}/{method}", "text": "t", "window": window, "method": method, "trained": 16, "span": 4,
                    "length": 64, "checkpoint": "abcdef0123456789", "placements": [[d, 2, 2 + d] for d in distances]}
            control = 4.0 + rng.normal(0, 0.1, len(distances))
            second = control + shift + rng.normal(0, 0.02, len(distances))
            record = {"passages": {"control": control.tolist(), "second_control": second.tolist()},
                      "seconds": {"control": 1.0, "second_control": 1.0}}
            found.append(cell)
            stored[key(cell)] = {"record": record, "seconds": 2.0}
    return Records(Settings(checkpoint="runs/micro"), tmp_path, found, stored, [])


def test_the_report_counts_false_positives_with_an_exact_interval_and_detects_a_planted_use(tmp_path):
    records = planted(tmp_path)
    by_cell = null_cells(records)
    assert len(by_cell) == 8 and all(len(values) == 6 for values in by_cell.values())
    report(records)
    text = (tmp_path / "report.md").read_text()
    assert '"uses", the cells one family (Holm), as every report tests them: 0 of 8 (0.0%, exact 95% [0.0%, 36.9%])' \
        in text
    # the planted use at twice the 0.05 margin, against per-window noise of 0.02 over 6 windows: found in most cells
    row = next(line for line in text.splitlines() if line.startswith("| 0.100 nats (2 x margin)"))
    found = int(row.split("|")[3].split(" of ")[0])
    assert found >= 6
    shifted = planted(tmp_path, shift=0.2)  # a real use of 0.2 in every window: the rule must see it
    report(shifted)
    assert '"uses", the cells one family (Holm), as every report tests them: 8 of 8' in (tmp_path / "report.md").read_text()
