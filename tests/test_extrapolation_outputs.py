"""What eval.extrapolation and eval.passkey write: the files their --help names (and no other), the position-shift
probe that the help promises, and a figure whose every line has a colour of its own, with a penalty panel."""
from __future__ import annotations

import json

import numpy as np
import pytest

from eval import figures
from eval.extrapolation import build_parser as extrapolation_parser
from eval.extrapolation import main as extrapolation
from eval.extrapolation import plot_results, summary_rows
from eval.passkey import build_parser as passkey_parser
from eval.passkey import main as passkey
from tests.conftest import train_micro_run


@pytest.fixture(scope="module")
def micro_run(prepared_data, tmp_path_factory):
    return train_micro_run(prepared_data, tmp_path_factory.mktemp("extrap") / "rope")


@pytest.fixture(scope="module")
def extrapolated(micro_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("extrap_out")
    assert extrapolation(["--checkpoint", str(micro_run), "--lengths", "1x,2x,4x", "--methods", "yarn,ntk",
                          "--tokens", "512", "--device", "cpu", "--out", str(out)]) == 0
    return out


def test_every_file_the_extrapolation_writes_is_named_in_its_help(extrapolated):
    help_text = extrapolation_parser().format_help()
    written = sorted(path.name for path in extrapolated.iterdir())
    assert written == ["plot.png", "results.json", "table.md"]
    assert [name for name in written if name not in help_text] == []


def test_the_probe_the_help_promises_is_in_the_results_and_the_table(extrapolated):
    """Either way the help and the outputs agree; here the probe runs: the 1x rows of the methods that take it
    hold its perplexity at offsets 0, L, 3L, 15L, equal for RoPE (it reads relative positions only)."""
    promised = "shift probe" in extrapolation_parser().format_help()
    rows = json.loads((extrapolated / "results.json").read_text())
    table = (extrapolated / "table.md").read_text()
    assert promised == any("probe" in row for row in rows) == ("Position-shift probe" in table)
    assert promised
    trained = rows[0]["trained_length"]
    probed = {row["label"]: row["probe"] for row in rows if row.get("probe")}
    assert set(probed) == {"rope"}  # yarn and ntk set their factor by length: no probe (model/methods/)
    assert [entry["offset"] for entry in probed["rope"]] == [0, trained, 3 * trained, 15 * trained]
    one_x = next(row for row in rows if row["label"] == "rope" and row["multiple"] == 1)
    ppl = [entry["ppl"] for entry in probed["rope"]]
    assert ppl[0] == pytest.approx(one_x["ppl"]) and max(ppl) - min(ppl) < 1e-3 * ppl[0]
    assert "| rope | 16 | " in table.split("Position-shift probe")[1]


def test_the_figure_has_a_penalty_panel_and_a_colour_per_line(extrapolated, tmp_path, monkeypatch):
    rows = json.loads((extrapolated / "results.json").read_text())
    alibi = [{**row, "label": row["label"].replace("rope", "alibi"), "name": "alibi", "position": "alibi"}
             for row in rows if row["method"] == "none"]
    drawn = {}
    monkeypatch.setattr(figures, "save", lambda figure, path, axis=None, below=False: drawn.update(figure=figure))
    plot_results(rows + alibi, tmp_path / "plot.png")
    ppl_axis, penalty_axis = drawn["figure"].axes
    assert "penalty" in penalty_axis.get_ylabel() and "perplexity" in ppl_axis.get_ylabel()
    for axis in (ppl_axis, penalty_axis):
        lines = {line.get_label(): line.get_color() for line in axis.get_lines() if not line.get_label().startswith("_")}
        assert set(lines) == {"rope", "rope+yarn", "rope+ntk", "alibi"}, lines
        assert len(set(lines.values())) == 4, lines
    beyond = [line for line in penalty_axis.get_lines() if line.get_label() == "rope"][0]
    assert min(beyond.get_xdata()) > rows[0]["trained_length"]  # the penalty exists beyond L only


def test_line_styles_give_each_line_its_own_colour_even_when_names_share_one():
    """Two checkpoints of one encoding, or a method whose colour is an encoding's (which method's is whose follows the
    methods' registry, which tests extend): every line gets a colour of its own, and the lines as trained keep their
    encoding's colour, wherever the method's line comes in the figure."""
    from model.methods import METHODS

    encodings = ["alibi", "none", "rope", "learned", "sinusoidal"]
    own = [figures.colour(encoding) for encoding in encodings]
    methods = [method for method in METHODS if method != "none"]
    assert any(figures.method_colour(method) in own for method in methods)  # a clash to resolve
    for method in methods:
        lines = [("rope", method), *[(encoding, "none") for encoding in encodings], ("rope", "none")]
        colours = [style["color"] for style in figures.line_styles(lines)]
        assert len(set(colours)) == len(lines), (method, colours)
        assert colours[1:-1] == own, method


def test_summary_rows_carry_the_probe_only_at_1x():
    from eval.extrapolation import CheckpointEvaluation

    plan = {"trained": 4, "lengths": [4, 8], "segment_length": 8, "probe_offsets": [0, 4]}
    evaluation = CheckpointEvaluation(plan, np.zeros((1, 8), dtype=np.float32),
                                      losses={"none@4": np.ones((1, 8), np.float32),
                                              "none@8": np.ones((1, 8), np.float32)},
                                      probe={"none@0": np.ones(2), "none@4": np.full(2, 2.0)})
    rows = summary_rows(evaluation, "m", "sinusoidal")
    assert [row.get("probe") is not None for row in rows] == [True, False]
    assert [entry["nll"] for entry in rows[0]["probe"]] == [1.0, 2.0]


def test_every_file_the_passkey_writes_is_named_in_its_help(micro_run, tmp_path):
    out = tmp_path / "passkey"
    assert passkey(["--checkpoint", str(micro_run), "--lengths", "160", "--depths", "0.5", "--trials", "1",
                    "--device", "cpu", "--out", str(out)]) == 0
    written = sorted(path.name for path in out.iterdir())
    assert written == ["passkey.png", "results.json"]
    assert [name for name in written if name not in passkey_parser().format_help()] == []
