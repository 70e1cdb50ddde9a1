"""experiments.use_grid: its cells (the layout a function of the settings and the text), one cell measured on a micro
checkpoint (the right tokens scored), the report's arithmetic on planted records (use, presence and order on the second
copies, harm on the natural window, intervals over windows, the verdicts, the impossible cells, the pairs), the rules
it reads from eval/verdicts.py, use_by_method for RULER, and the study run end to end through the engine."""
import json

import numpy as np
import pytest
import torch

from data.tokenizer import leading_ids, load_tokenizer
from errors import ConfigError, DataError
from eval.scoring import score_windows
from eval.use import GRID_POSITIVE, Placement, grid_forwards, grid_pairs, summarise_grid, window_starts
from eval.verdicts import impossible_use, relay_reach, separated_by_windows
from experiments.engine import Context, Records, key
from experiments.engine import main as engine_main
from experiments.use_grid import Settings, cells, measure, read_text, use_by_method
from experiments.use_grid_report import load, precision, shown
from model import Transformer
from model.checkpoint import load_model, save_checkpoint
from model.methods import method_spec
from tests.conftest import micro_config

MICRO = dict(length="4x", windows=3, passages=1, distances=["0.5x", "1.25x", "2x"], within=["0.5x"], dynamic_step=8,
             dtype="float32")


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=64))
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 64, "step": 0})
    return folder


def micro_cells(checkpoint, text, tmp_path, **changes):
    settings = Settings(checkpoint=str(checkpoint), texts=[str(text)], methods=["none", "dynamic", "sinks"],
                        out=str(tmp_path / "grid"), **{**MICRO, **changes})
    return cells(settings, Context(tmp_path / "grid"))


def test_windows_leave_equal_gaps_and_refuse_a_short_text():
    assert window_starts(1000, 99, 3) == [175, 450, 725]  # 3 windows of 100 tokens, 700 left: gaps of 175
    with pytest.raises(DataError, match="too few"):
        window_starts(300, 99, 3)


def test_the_cells_carry_the_layout_drawn_per_window(checkpoint, small_text_file, tmp_path):
    found = micro_cells(checkpoint, small_text_file, tmp_path)
    assert [c["name"] for c in found[:4]] == ["code/w0/positive", "code/w0/none", "code/w0/dynamic", "code/w0/sinks"]
    assert len(found) == 12 and {c["window"] for c in found} == {0, 1, 2}
    positive = [c for c in found if c["method"] == GRID_POSITIVE]
    assert all(c["length"] == 64 and {p[0] for p in c["placements"]} == {32} for c in positive)
    methods = [c for c in found if c["method"] != GRID_POSITIVE]
    assert all(p[2] >= 64 for c in methods for p in c["placements"])  # every second copy past L
    assert all(c["start"] > 0 and c["length"] == 256 for c in methods)  # none at the text's first token
    by_window = {c["window"]: c["placements"] for c in methods}
    assert all(c["placements"] == by_window[c["window"]] for c in methods)  # the same places under every method
    assert by_window[0] != by_window[1]  # each window its own draw
    assert [c.get("step") for c in methods[:3]] == [None, 8, None]  # only dynamic NTK runs in chunks
    assert "local" in found[0] and str(small_text_file) == found[0]["local"]["text"]
    assert [key(c) for c in micro_cells(checkpoint, small_text_file, tmp_path)] == [key(c) for c in found]
    reseeded = micro_cells(checkpoint, small_text_file, tmp_path, seed=1)
    assert reseeded[1]["placements"] != found[1]["placements"]
    with pytest.raises(ConfigError, match="must exceed L"):
        micro_cells(checkpoint, small_text_file, tmp_path, length="1x")


def test_a_cell_scores_tokens_2_to_s_of_each_second_copy(checkpoint, small_text_file, tmp_path):
    found = micro_cells(checkpoint, small_text_file, tmp_path)
    cell = found[1]  # plain RoPE in window 0
    record = measure(cell, Context(tmp_path, 1))
    assert set(record["seconds"]) == {"natural", "probe", "control", "shuffled"} and record["reach"] is None
    ids = read_text(small_text_file, load_tokenizer(checkpoint))
    placements = [Placement(*p) for p in cell["placements"]]
    forwards = grid_forwards(ids, cell["start"], 256, placements, cell["span"], [0, 0, 0])
    view = load_model(checkpoint).eval().under(method_spec("none"), 256, 64)
    for kind in ("probe", "control", "shuffled"):
        losses = score_windows(view, forwards[kind])[0]
        expected = [losses[p.second : p.second + cell["span"] - 1].mean() for p in placements]
        assert record["passages"][kind] == pytest.approx(expected, abs=1e-5)
    natural = score_windows(view, forwards["natural"])[0]
    assert record["natural"]["within"] == pytest.approx(natural[:64].mean(), abs=1e-5)
    assert record["natural"]["past"] == pytest.approx(natural[64:].mean(), abs=1e-5)
    control = measure(found[0], Context(tmp_path, 1))  # the positive control: no natural forward
    assert "natural" not in control and set(control["seconds"]) == {"probe", "control", "shuffled"}
    moved = {**cell, "text_digest": "0" * 16}
    with pytest.raises(ConfigError, match="not the checkpoint and text"):
        measure(moved, Context(tmp_path, 1))


def test_a_tokenizers_leading_ids_start_every_window(checkpoint, small_text_file, tmp_path):
    """A tokenizer that starts a text with <bos> (Gemma's) has each window start with it, over the window's first
    token, which holds no passage; ours starts a text with nothing, so its cells are declared as they always were."""
    found = micro_cells(checkpoint, small_text_file, tmp_path)
    assert not any("lead" in cell for cell in found) and leading_ids(load_tokenizer(checkpoint)) == []
    cell = {**found[1], "lead": [7]}
    record = measure(cell, Context(tmp_path, 1))
    ids = read_text(small_text_file, load_tokenizer(checkpoint))
    placements = [Placement(*p) for p in cell["placements"]]
    assert min(p.first for p in placements) > 0  # the first token holds no passage
    forwards = grid_forwards(ids, cell["start"], 256, placements, cell["span"], [0, 0, 0])
    view = load_model(checkpoint).eval().under(method_spec("none"), 256, 64)
    for kind in ("probe", "natural"):
        window = forwards[kind].copy()
        window[:, 0] = 7
        losses = score_windows(view, window)[0]
        if kind == "probe":
            expected = [losses[p.second : p.second + cell["span"] - 1].mean() for p in placements]
            assert record["passages"][kind] == pytest.approx(expected, abs=1e-5)
        else:
            assert record["natural"]["within"] == pytest.approx(losses[:64].mean(), abs=1e-5)
    assert record["natural"]["within"] != pytest.approx(measure(found[1], Context(tmp_path, 1))["natural"]["within"],
                                                         abs=1e-6)


def planted(tmp_path, windows=4, texts=("text",)) -> Records:
    """Records of L = 16, T = 32, passages of 4 tokens at d = 20 (the positive control at d = 8): the probe 1 nat below
    the control on the second copy (use 1), the shuffled control 0.25 below (presence 0.25, order 0.75); plain RoPE's
    natural window at 2 nats within L and 3 past it, YaRN's at 2.1 and 2.5; sinks + window (reach 12) reads nothing
    (use 0) at 2.0 and 2.4."""
    rng = np.random.default_rng(0)
    found, stored = [], {}
    for text in texts:
        for window in range(windows):
            for method, within, past, use, reach in ((GRID_POSITIVE, None, None, 1.0, None),
                                                      ("none", 2.0, 3.0, 1.0, None), ("yarn", 2.1, 2.5, 1.0, None),
                                                      ("sinks", 2.0, 2.4, 0.0, 12)):
                positive = method == GRID_POSITIVE
                cell = {"name": f"{text}/w{window}/{method}", "text": text, "window": window, "start": 10 * window,
                        "tokens": 1000, "trained": 16, "length": 16 if positive else 32, "span": 4, "method": method,
                        "placements": [[8, 4, 12]] if positive else [[20, 5, 25]]}
                control = 4.0 + rng.normal(0, 0.01)
                record = {"passages": {"probe": [control - use], "control": [control], "shuffled": [control - use / 4]},
                          "seconds": {"probe": 1.0, "control": 1.0, "shuffled": 1.0}, "reach": reach,
                          "paths": {}, "dtype": "bfloat16"}
                if not positive:
                    record["natural"] = {"within": within, "past": past}
                    record["seconds"]["natural"] = 2.0
                found.append(cell)
                stored[key(cell)] = {"record": record, "seconds": 5.0}
    return Records(Settings(checkpoint="runs/micro", passages=1), tmp_path, found, stored, [])


def test_the_report_reads_use_presence_order_and_harm_from_the_records(tmp_path):
    summary = summarise_grid(load(planted(tmp_path)))
    text = summary["texts"]["text"]
    assert text["positive"][8]["mean"] == pytest.approx(1.0) and text["margin"] == pytest.approx(0.1)
    assert list(text["methods"]) == ["none", "yarn", "sinks"]  # the positive control is not a method row
    yarn = text["methods"]["yarn"]
    assert yarn[20]["use"]["mean"] == pytest.approx(1.0) and yarn[20]["presence"]["mean"] == pytest.approx(0.25)
    assert yarn[20]["order"]["mean"] == pytest.approx(0.75)
    assert yarn["cost_within"]["mean"] == pytest.approx(0.1) and yarn["penalty"]["mean"] == pytest.approx(0.5)
    assert yarn[20]["use"]["verdict"] == "uses" and yarn["reach"] == 20
    sinks = text["methods"]["sinks"]
    assert sinks[20]["use"]["verdict"] == "none" and sinks["reach"] is None
    impossible, = summary["impossible"]  # sinks + window: a 12-key window relays 11 tokens, + a 4-token passage < 20
    assert (impossible["method"], impossible["distance"]) == ("sinks", 20) and "12-key windows" in impossible["why"]
    split = summary["position"]  # the one passage's second copy at 25: the largest distance's first place
    assert split["cut"] == 25 and split["methods"]["yarn"][20]["from"]["mean"] == pytest.approx(1.0)
    assert split["methods"]["yarn"][20]["before"] == {"n": 0, "values": []}
    pair, = summary["pairs"]  # YaRN against sinks + window, paired by window at the distance past L
    assert (pair["a"], pair["b"], pair["windows"]) == ("yarn", "sinks", 4)
    assert pair["use"][20]["mean"] == pytest.approx(1.0) and pair["past"]["mean"] == pytest.approx(0.1)
    assert pair["past"]["holm"] is False  # the same difference in every window: no t test, never separated


def test_the_report_says_which_precision_each_cell_computed_in(tmp_path):
    records = planted(tmp_path)  # 16 cells in bfloat16; one more computed in float32 on another machine
    assert precision(records) == "Precision: bfloat16 in 16 cells."
    cell, record = records.done()[-1]
    records.stored[key(cell)]["record"] = {**record, "dtype": "float32"}
    assert precision(records) == f"Precision: bfloat16 in 15 cells, float32 in 1 cell ({cell['name']})."


def test_two_windows_print_their_values_and_no_interval(tmp_path):
    use = summarise_grid(load(planted(tmp_path, windows=2)))["texts"]["text"]["methods"]["yarn"][20]["use"]
    assert "low" not in use and use["verdict"] == "cannot tell"
    assert shown(use) == "+1.000, +1.000 (2 windows: no interval)"


def test_paired_differences_are_separated_only_after_holm_over_the_table():
    rng = np.random.default_rng(1)
    windows = {m: [{"past": 3.0 + shift + rng.normal(0, 0.01), 20: {"use": 1.0 + rng.normal(0, 0.5)}} for _ in range(8)]
               for m, shift in (("rerope", 0.0), ("selfextend", -0.05), ("string", -0.05))}
    rows = {(row["a"], row["b"]): row for row in grid_pairs({"t": {"distances": [20], "trained": 16,
                                                                    "methods": windows}})}
    # 0.05 nats apart in every window with a spread of 0.01: separated; the same means: not
    assert rows[("rerope", "selfextend")]["past"]["holm"] and not rows[("selfextend", "string")]["past"]["holm"]
    assert not any(row["use"][20]["holm"] for row in rows.values())  # use: noise only


def test_the_rules_of_impossible_use_and_of_separated_pairs():
    # 4 layers of 64-key windows relay 4 x 63 = 252 tokens; a 16-token passage 256 back still has tokens within it
    assert relay_reach(64, 4) == 252 and relay_reach(None, 4) is None
    assert impossible_use(256, 64, 4, 16) is None and impossible_use(268, 64, 4, 16) is None
    assert impossible_use(269, 64, 4, 16).startswith("past what its 4 layers of 64-key windows relay (252 tokens)")
    assert impossible_use(10**6, None, 30, 64) is None  # no window: nothing is impossible by construction
    # t = 4 over 8 windows: p ~ 0.005, kept alone, not among 20 at 5% (Holm: 0.05 / 20 = 0.0025)
    assert separated_by_windows([(0.4, 0.1, 8)]) == [True]
    assert separated_by_windows([(0.4, 0.1, 8)] + [(0.0, 0.1, 8)] * 19)[0] is False
    assert separated_by_windows([(0.4, 0.0, 8), (0.4, None, 8)]) == [False, False]


def test_use_by_method_gives_ruler_each_methods_mean_use_per_text_and_distance(tmp_path):
    found = use_by_method(planted(tmp_path, texts=("a", "b")))
    assert sorted(found) == ["none", "sinks", "yarn"]  # not the positive control
    assert found["yarn"] == {"a": {20: pytest.approx(1.0)}, "b": {20: pytest.approx(1.0)}}
    assert found["sinks"]["a"][20] == pytest.approx(0.0)


@pytest.mark.integration  # the study through the engine on a micro checkpoint, ~20 s
def test_the_study_runs_resumes_and_reports_through_the_engine(checkpoint, small_text_file, tmp_path):
    out = tmp_path / "grid"
    arguments = ["--checkpoint", str(checkpoint), "--texts", str(small_text_file), "--length", "4x", "--windows", "3",
                 "--passages", "1", "--distances", "0.5x,1.25x,2x", "--within", "0.5x", "--dynamic-step", "8",
                 "--methods", "none,dynamic,sinks", "--workers", "1", "--threads", "1", "--out", str(out)]
    assert engine_main("experiments.use_grid", arguments) == 0
    assert len(list((out / "records").glob("*.json"))) == 12  # 3 windows x (positive control + 3 methods)
    report = (out / "report.md").read_text()
    assert "## code" in report and "## Cells where use is impossible by construction" in report
    # sinks + window: 60 keys, relayed by the micro model's layers past the farthest distance (2L = 128)
    assert "None: every method here either sees every key or relays its window" in report
    assert "## The margin: the verdicts against a fixed 0.05 nats" in report
    row = next(line for line in report.splitlines() if line.startswith("| sinks + window | 3 |"))
    assert "[" in row  # three windows: intervals
    assert (out / "use.png").stat().st_size > 0
    assert engine_main("experiments.use_grid", arguments) == 0  # again: every cell has its record
    log = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert [item["measured"] for item in log] == [12, 0]
    again = (out / "report.md").read_text()
    (out / "report.md").unlink()
    assert engine_main("experiments.use_grid", ["--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == again  # from the records alone
