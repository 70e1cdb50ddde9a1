"""experiments.method_grid on a micro checkpoint (cells cached by window, resumed, another layout refused) and its
report's arithmetic on a planted cache: use, presence and order on the second copies' tokens 2..S, harm on the
natural window, intervals over windows, and the calibration's impossible cells."""
import json

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from errors import ConfigError
from eval.use import Placement
from experiments.method_grid import FORWARDS, cell_record, main, window_starts
from experiments.method_grid_report import load_cells, summarise, window_entry
from experiments.real_model import machine
from model import Transformer
from model.checkpoint import save_checkpoint
from tests.conftest import micro_config


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=64))
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 64, "step": 0})
    return folder


def run(checkpoint, text, out, *extra):
    return main(["--checkpoint", str(checkpoint), "--texts", str(text), "--length", "4x", "--windows", "3",
                 "--passages", "1", "--distances", "0.5x,1.25x,2x", "--within", "0.5x", "--dynamic-step", "8",
                 "--out", str(out), *extra])


def test_cells_are_cached_by_window_resumed_and_reported(checkpoint, small_text_file, tmp_path, capsys):
    out = tmp_path / "grid"
    assert run(checkpoint, small_text_file, out, "--methods", "none,dynamic,sinks") == 0
    cache = out / "cache" / "code"
    assert sorted(p.name for p in (cache / "w2").iterdir()) == ["dynamic.json", "none.json", "positive.json",
                                                                "sinks.json"]
    cell = json.loads((cache / "w0" / "dynamic.json").read_text())
    assert sorted(cell["passages"]) == ["control", "probe", "shuffled"] and len(cell["passages"]["probe"]) == 3
    assert len(cell["natural"]["bins"]) == 1 and cell["step"] == 8 and set(cell["seconds"]) == set(FORWARDS)
    layout = json.loads((cache / "layout.json").read_text())
    assert layout["starts"][0] > 0  # no window at the text's first token
    assert all(p[2] >= 64 for window in layout["placements"] for p in window)  # second copies past L
    first = json.loads((out / "cache" / "invocations.json").read_text())
    assert [item["cells"] for item in first] == [12]  # 3 windows x (positive control + 3 methods)
    capsys.readouterr()
    assert run(checkpoint, small_text_file, out, "--methods", "none,dynamic,sinks") == 0
    assert "/w0/" not in capsys.readouterr().out  # every cell came from the cache
    assert [item["cells"] for item in json.loads((out / "cache" / "invocations.json").read_text())] == [12, 0]
    results = json.loads((out / "results.json").read_text())["summary"]["texts"]["code"]
    sinks = results["methods"]["sinks"]
    assert sinks["windows"] == 3 and sinks["attention_reach"] == 60  # sinks + window: L - 4 keys
    assert "low" in sinks["128"]["use"]  # three windows: an interval
    report = (out / "report.md").read_text()
    assert "Calibration: cells where use is impossible" in report and "past its attention's reach" in report
    minutes = report[report.index("Minutes per cell (its four forwards), code, by window"):]
    row = next(line for line in minutes.splitlines() if line.startswith("| sinks + window |"))
    assert len([cell for cell in row.split("|")[2:-1] if cell.strip()]) == 3  # the wall time of each of its cells
    from experiments.method_grid import Layout
    with pytest.raises(ConfigError, match="other settings"):  # another layout on the same cache is refused
        Layout(out, "code", np.zeros(10**6, dtype=np.int64), 256, 64, 4, [32, 80, 128], [32], 1, 0)


def test_a_killed_run_keeps_its_record_up_to_its_last_cell(checkpoint, small_text_file, tmp_path, monkeypatch):
    from experiments import method_grid
    compute, calls = method_grid.Grid.compute, []

    def killed_on_the_third_cell(self, *args):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        compute(self, *args)

    monkeypatch.setattr(method_grid.Grid, "compute", killed_on_the_third_cell)
    out = tmp_path / "grid"
    with pytest.raises(KeyboardInterrupt):
        run(checkpoint, small_text_file, out, "--methods", "none,sinks")
    log = json.loads((out / "cache" / "invocations.json").read_text())
    assert len(log) == 1 and log[0]["cells"] == 2 and "experiments.method_grid" in log[0]["command"]
    assert log[0]["machine"] == machine()
    monkeypatch.undo()
    assert run(checkpoint, small_text_file, out, "--methods", "none,sinks") == 0  # resumes: a second record
    log = json.loads((out / "cache" / "invocations.json").read_text())
    assert [item["cells"] for item in log] == [2, 7] and "2 cells" in (out / "report.md").read_text()


def test_windows_leave_equal_gaps_and_refuse_a_short_text():
    starts = window_starts(1000, 99, 3)  # 3 windows of 100 tokens, 700 left: gaps of 175
    assert starts == [175, 450, 725]
    with pytest.raises(Exception, match="too few"):
        window_starts(300, 99, 3)


def planted(tmp_path, windows=4):
    """A cache of one text: L = 16, T = 32, passages of 4 tokens at d = 20; the probe's scored tokens 1 nat below the
    control's (use 1), the shuffled control's 0.25 below (presence 0.25, order 0.75); plain RoPE's natural window
    at 2 nats within L and 3 past it, YaRN's at 2.1 and 2.5; sinks + window reads nothing (use 0), at 2.0 and 2.4."""
    out = tmp_path / "planted"
    folder = out / "cache" / "text"
    placements = [[20, 5, 25]]
    positive = [[8, 4, 12]]
    settings = {"tokens": 1000, "length": 32, "trained": 16, "windows": windows, "distances": [20], "within": [8],
                "passages": 1, "span": 4, "seed": 0}
    folder.mkdir(parents=True)
    (folder / "layout.json").write_text(json.dumps({"settings": settings, "starts": list(range(windows)),
                                                    "placements": [placements] * windows,
                                                    "positive": [positive] * windows}))
    rng = np.random.default_rng(0)
    common = {"seconds": {"natural": 1.0, "probe": 1.0}, "peak_rss_gib": 1.0, "paths": {}, "dtype": "bfloat16",
              "incremental": False, "step": 1, "reach": None}
    for window in range(windows):
        (folder / f"w{window}").mkdir()
        for method, within, past, use in (("none", 2.0, 3.0, 1.0), ("yarn", 2.1, 2.5, 1.0), ("sinks", 2.0, 2.4, 0.0)):
            natural = np.r_[np.full(16, within), np.full(16, past)].astype(np.float32)
            control = np.full(32, 4.0, dtype=np.float32) + rng.normal(0, 0.01)
            probe, shuffled = control.copy(), control.copy()
            probe[25:28] -= use  # tokens 2..4 of the second copy at 25: loss columns 25, 26, 27
            shuffled[25:28] -= 0.25 * use
            probe[28:] -= 9.0  # past the copy: never scored
            record = cell_record({"natural": natural, "probe": probe, "control": control, "shuffled": shuffled},
                                 [Placement(20, 5, 25)], 4, 16)
            (folder / f"w{window}" / f"{method}.json").write_text(json.dumps({**record, **common}))
        positive_control = np.full(16, 3.0, dtype=np.float32)
        record = cell_record({"probe": positive_control - np.r_[np.zeros(12), np.ones(4)],
                              "control": positive_control, "shuffled": positive_control}, [Placement(8, 4, 12)], 4, 16)
        (folder / f"w{window}" / "positive.json").write_text(json.dumps({**record, **common}))
    return out


def test_the_report_reads_use_presence_order_and_harm_from_the_right_tokens(tmp_path):
    record = json.loads((planted(tmp_path) / "cache" / "text" / "w0" / "yarn.json").read_text())
    entry = window_entry(record, [Placement(20, 5, 25)], [20])
    assert entry[20]["use"] == pytest.approx(1.0) and entry[20]["presence"] == pytest.approx(0.25)
    assert entry[20]["order"] == pytest.approx(0.75)
    assert entry["within"] == pytest.approx(2.1) and entry["past"] == pytest.approx(2.5)
    summary = summarise(load_cells(tmp_path / "planted"))
    text = summary["texts"]["text"]
    assert text["positive"][8]["mean"] == pytest.approx(1.0)  # the positive control: tokens 2..4 of the copy at 12
    assert text["margin"] == pytest.approx(0.1)
    yarn = text["methods"]["yarn"]
    assert yarn["cost_within"]["mean"] == pytest.approx(0.1) and yarn["penalty"]["mean"] == pytest.approx(0.5)
    assert yarn[20]["use"]["verdict"] == "uses" and yarn["reach"] == 20
    split = summary["position"]  # the one passage's second copy at 25: the largest distance's first place
    assert split["cut"] == 25 and split["methods"]["yarn"][20]["from"]["mean"] == pytest.approx(1.0)
    assert split["methods"]["yarn"][20]["before"] == {"n": 0, "values": []} and list(split["methods"])[0] == "none"
    pair, = summary["pairs"]  # YaRN against sinks + window, paired by window at the distance past L
    assert (pair["a"], pair["b"], pair["windows"]) == ("yarn", "sinks", 4)
    assert pair["use"][20]["mean"] == pytest.approx(1.0) and pair["past"]["mean"] == pytest.approx(0.1)
    assert pair["past"]["low"] == pytest.approx(0.1) == pair["past"]["high"]  # the same difference in every window
    assert pair["past"]["holm"] is False  # no spread over windows: no t test, so never called separated


def test_a_cell_of_two_windows_prints_its_values_and_no_interval(tmp_path):
    from experiments.method_grid_report import shown
    summary = summarise(load_cells(planted(tmp_path, windows=2)))
    use = summary["texts"]["text"]["methods"]["yarn"][20]["use"]
    assert "low" not in use and use["verdict"] == "cannot tell"
    assert shown(use).endswith("(2 windows: no interval)")


def test_two_texts_side_by_side_and_a_value_the_same_in_every_window(tmp_path):
    import shutil

    from experiments.method_grid_report import texts_side_by_side
    cache = planted(tmp_path) / "cache"
    shutil.copytree(cache / "text", cache / "other")
    summary = summarise(load_cells(tmp_path / "planted"))
    lines = texts_side_by_side(summary)
    assert lines[0] == "## The texts side by side: other / text"
    plain = next(line for line in lines if line.startswith("| plain RoPE |"))
    # plain RoPE against itself: the same 0 in every window, not a zero-width interval
    assert "| +0.000 in every window / +0.000 in every window |" in plain
    yarn = next(line for line in lines if line.startswith("| YaRN | 4 / 4 |")).split(" | ")
    assert yarn[2] == "+1.000 in every window / +1.000 in every window"  # use d = 20 on each text
    assert yarn[3] == "+0.100 in every window / +0.100 in every window"  # cost within L


def test_a_cell_another_process_holds_is_skipped_and_taken_once_it_is_free(checkpoint, small_text_file, tmp_path):
    import fcntl
    out = tmp_path / "grid"
    held = out / "cache" / "code" / "w0" / "none.lock"
    held.parent.mkdir(parents=True)
    with open(held, "w") as lock:  # another process computing plain RoPE's first window
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run(checkpoint, small_text_file, out, "--methods", "none,sinks") == 0
        assert not (out / "cache" / "code" / "w0" / "none.json").exists()  # left to its holder
        assert (out / "cache" / "code" / "w0" / "sinks.json").exists() and (out / "cache" / "code" / "w2" / "none.json").exists()
    assert run(checkpoint, small_text_file, out, "--methods", "none,sinks") == 0  # released: taken now
    assert (out / "cache" / "code" / "w0" / "none.json").exists() and not held.exists()
    log = json.loads((out / "cache" / "invocations.json").read_text())
    assert [item["cells"] for item in log] == [8, 1]


def test_paired_differences_are_called_separated_only_after_holm_over_the_table(tmp_path):
    from experiments.method_grid_report import paired
    rng = np.random.default_rng(1)
    texts = {"t": {"layout": {"settings": {"distances": [20], "trained": 16}},
                   "methods": {m: [{"past": 3.0 + shift + rng.normal(0, 0.01), 20: {"use": 1.0 + rng.normal(0, 0.5)}}
                                   for _ in range(8)]
                               for m, shift in (("rerope", 0.0), ("selfextend", -0.05), ("string", -0.05))}}}
    rows = {(row["a"], row["b"]): row for row in paired(texts, {})}
    # 0.05 nats apart in every window with a spread of 0.01: separated; the same means: not
    assert rows[("rerope", "selfextend")]["past"]["holm"] and not rows[("selfextend", "string")]["past"]["holm"]
    assert not any(row["use"][20]["holm"] for row in rows.values())  # use: noise only
