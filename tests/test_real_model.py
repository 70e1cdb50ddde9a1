"""experiments.real_model on a micro checkpoint: its cells (a prefix of a longer cell with the same settings is no cell,
dynamic NTK only past L), what measure records (the position buckets, tails and bins of one window; use rows; a
passkey row), the intervals over windows and the pairing with plain RoPE, a migrated record rendered as it was, and
the study end to end through the engine."""
import json

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from eval.extrapolation import position_rows
from eval.heldout import text_tokens
from eval.scoring import score_windows
from experiments import real_model
from experiments.engine import Context, Records, key, main
from model import Transformer
from model.checkpoint import load_model, save_checkpoint, weights_digest
from tests.conftest import micro_config


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=16)), tokenizer,
                    {"trained_seq_len": 16, "step": 0})
    return folder


def settings(checkpoint, text, out, **changes):
    values = dict(checkpoint=str(checkpoint), texts=[str(text)], windows=3, dynamic_tail=4, passkey_lengths=["160"],
                  passkey_methods=["none"], depths=[0.5], trials=1, methods=["none", "yarn", "dynamic", "selfextend",
                                                                               "logn"],
                  use_methods=["none", "sinks"], use_lengths=["1x", "4x"], use_distances=["0.75x", "1.25x"],
                  use_windows=3, use_passages=1, dtype="float32", out=str(out))
    return real_model.Settings(**{**values, **changes})


def test_cells_leave_out_what_a_longer_cell_holds(checkpoint, small_text_file, tmp_path):
    declared = real_model.cells(settings(checkpoint, small_text_file, tmp_path), Context(tmp_path))
    nll = {(c["window"], c["method"], c["length"]) for c in declared if c["kind"] == "nll"}
    assert {(m, n) for w, m, n in nll if w == 0} == {
        ("none", 64), ("yarn", 64), ("yarn", 32), ("dynamic", 64), ("dynamic", 32), ("selfextend", 64),
        ("selfextend", 32), ("selfextend", 16), ("logn", 64)}  # yarn at 1x is plain RoPE; logn the same at any length
    assert {w for w, _, _ in nll} == {0, 1, 2}
    digest = weights_digest(checkpoint)
    assert all(c["checkpoint"] == digest and c["trained"] == 16 for c in declared)
    text = next(c for c in declared if c["kind"] == "nll")
    assert text["text"] == "code" and len(text["text_sha256"]) == 16 and text["local"]["text"] == str(small_text_file)
    starts = sorted({c["start"] for c in declared if c["kind"] == "nll"})
    assert len(starts) == 3 and starts[0] == 0  # three windows of 4L spread over the text, the first at its start
    assert [c["name"] for c in declared if c["kind"] == "passkey"] == ["passkey/none@160/d0.5"]
    use = {(c["method"], c["length"]): c["distances"] for c in declared if c["kind"] == "use"}
    assert use == {("none", 64): [12, 20], ("sinks", 64): [12, 20]}  # no passage of 8 tokens fits d = 12 in L = 16
    moved = {**text, "local": {**text["local"], "text": "elsewhere.txt"}}
    assert key(moved) == key(text)  # where the text lies is not what the cell is


def test_an_nll_record_holds_the_window_by_position(checkpoint, small_text_file, tmp_path):
    declared = real_model.cells(settings(checkpoint, small_text_file, tmp_path), Context(tmp_path))
    cell = next(c for c in declared if c["kind"] == "nll" and (c["method"], c["length"], c["window"]) == ("none", 64, 1))
    record = real_model.measure(cell, Context(tmp_path, 1, "cpu"))
    ids = text_tokens(str(small_text_file), load_tokenizer(checkpoint))
    losses = score_windows(load_model(checkpoint), ids[None, cell["start"]:cell["start"] + 65])[0]
    spans = {(b, e): v for b, e, v in record["spans"]}
    assert set(spans) == {(0, 16), (16, 32), (32, 64), (28, 32), (60, 64)}  # buckets and the tails before 2L, 4L
    assert spans[(16, 32)] == pytest.approx(losses[16:32].mean(), abs=1e-5)
    assert spans[(60, 64)] == pytest.approx(losses[60:64].mean(), abs=1e-5)
    assert record["bin_width"] == 2 and np.allclose(record["bins"], losses.reshape(-1, 2).mean(axis=1), atol=1e-5)
    assert record["paths"] == {"none": ["sdpa"]} and record["dtype"] == "float32"
    dynamic = next(c for c in declared if c["kind"] == "nll" and (c["method"], c["length"]) == ("dynamic", 32))
    tail = real_model.measure(dynamic, Context(tmp_path, 1, "cpu"))
    assert [span[:2] for span in tail["spans"]] == [[28, 32]] and tail["bins"] == []


def test_rows_are_intervals_over_windows_paired_with_plain_rope():
    spans = {("t", w, "none", 64): [[0, 16, 2.0 + w], [16, 32, 3.0 + w], [28, 32, 4.0], [32, 64, 5.0 + w]]
             for w in range(3)}
    spans.update({("t", w, "yarn", 32): [[0, 16, 2.5 + w], [16, 32, 3.1 + w], [28, 32, 4.0 - w]] for w in range(2)})
    rows = {(r["method"], r["length"], tuple(r["bucket"])): r for r in position_rows(spans, 16)}
    plain = rows[("none", 32, (16, 32))]  # plain RoPE at 2x read from its 4x cells
    assert plain["windows"] == 3 and plain["nll"] == pytest.approx(4.0) and plain["nll_low"] < 4.0 < plain["nll_high"]
    assert plain["vs_plain"] is None and rows[("none", 32, (28, 32))]["kind"] == "tail"
    yarn = rows[("yarn", 32, (16, 32))]  # two windows: their values, no interval
    assert yarn["windows"] == 2 and yarn["nll_low"] is None and yarn["values"] == pytest.approx([3.1, 4.1])
    assert yarn["vs_plain_values"] == pytest.approx([0.1, 0.1]) and yarn["kind"] == "bucket"
    assert ("none", 16, (0, 16)) not in rows and ("yarn", 32, (32, 64)) not in rows
    low = position_rows({("t", w, "none", 16): [[0, 16, v]] for w, v in enumerate([0.01, 0.02, 3.0])}, 16)[0]
    assert low["nll_low"] == 0.0  # a mean NLL's interval is cut at 0


def test_the_report_renders_a_migrated_record_as_it_was(tmp_path):
    cell = {"name": "nll/migrated", "kind": "nll", "checkpoint": None, "trained": 16, "dtype": "auto",
            "texts": {"book": 1000}, "local": {}}
    rows = [{"text": "book", "method": m, "length": 32, "bucket": [16, 32], "kind": "bucket", "windows": n,
             "nll": 3.0, "nll_low": low, "nll_high": high, "vs_plain": diff, "vs_plain_low": None,
             "vs_plain_high": None, **extra} for m, n, low, high, diff, extra in [
                 ("none", 3, 2.5, 3.5, 0.0, {}),
                 ("yarn", 2, None, None, -0.5, {"values": [2.9, 3.1], "vs_plain_values": [-0.4, -0.6]}),
                 ("ntk", 3, 0.0, 6.0, 0.0, {"values": [2.0, 3.0, 4.0]})]]
    record = {"rows": rows, "paths": {"yarn": ["sdpa"]}, "dtype": "bfloat16", "peak_rss_gib": 1.5}
    stored = {key(cell): {"record": record, "seconds": 60.0}}
    invocation = {"command": "python -m x", "machine": "m", "where": "w", "wall_s": 60.0}
    real_model.report(Records(real_model.Settings(out=str(tmp_path), checkpoint="runs/smollm2"), tmp_path, [cell],
                              stored, [invocation]))
    report = (tmp_path / "report.md").read_text()
    # a mean NLL is a level: no interval where only its mean was kept, else the t interval of the logs, exponentiated
    assert "| 16-32 | 0.03125k (2x) | none | 3 | 3.000 | (the reference) |" in report
    logs = np.log([2.0, 3.0, 4.0])
    half = 4.302653 * logs.std(ddof=1) / np.sqrt(3)
    assert f"| ntk | 3 | {np.exp(logs.mean()):.3f} [{np.exp(logs.mean() - half):.3f}, {np.exp(logs.mean() + half):.3f}] |" \
        in report
    assert "| 16-32 | 0.03125k (2x) | yarn | 2 | 2.900 / 3.100 (2 windows: no interval) | -0.400 / -0.600 (2 windows: " \
           "no interval) |" in report
    assert "book (1,000 tokens" in report and "yarn: sdpa" in report and "bfloat16" in report
    assert "nll 1.0 min (1 cells)" in report and "peak resident memory of any cell 1.5 GiB" in report
    assert not (tmp_path / "nll_by_position.png").exists()  # no bins: no curve to draw


@pytest.mark.integration
def test_the_study_end_to_end(checkpoint, small_text_file, tmp_path):
    out = tmp_path / "real"
    argv = ["--checkpoint", str(checkpoint), "--texts", str(small_text_file), "--windows", "3", "--dynamic-tail", "4",
            "--methods", "none,yarn,dynamic,selfextend,logn", "--passkey-lengths", "160", "--passkey-methods", "none",
            "--depths", "0.5", "--trials", "1", "--use-methods", "none,sinks", "--use-lengths", "1x,4x",
            "--use-distances", "0.75x,3x", "--use-windows", "3", "--use-passages", "1", "--dtype", "float32",
            "--out", str(out), "--workers", "1", "--threads", "1"]
    assert main("experiments.real_model", argv) == 0
    report = (out / "report.md").read_text()
    assert "## code: mean NLL by position bucket" in report and "## code: the last 4 positions before 2L" in report
    assert "| 60-64 | 0.0625k (4x) | dynamic | 3 |" in report and "| 0-16 | 0.015625k (1x) | none | 3 |" in report
    assert "selfextend: merged" in report and "none: sdpa" in report
    assert "1 cells with fewer than 10 trials each are left out" in report and "Passkey retrieval" not in report
    assert "## code: use of the text on the same weights" in report and "positive control: not measured" in report
    # 3L = 48 back lies past what 2 layers of 16-key windows relay (30) plus a passage; 0.75L = 12 does not
    assert "negative control (sinks, d = 48 beyond its reach)" in report and "d = 12 beyond" not in report
    assert "Reproduce: `python -m experiments.real_model" in report and (out / "nll_by_position.png").exists()
    records = {p.name: p.stat().st_mtime_ns for p in (out / "records").glob("*.json")}
    assert len(records) == 1 + 27 + 1 + 2  # the checkpoint, 9 NLL cells per window, the passkey, 2 use cells
    assert main("experiments.real_model", argv) == 0  # a rerun measures nothing again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "records").glob("*.json")} == records
    assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["measured"] == 0
    (out / "report.md").unlink()
    assert main("experiments.real_model", ["--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text().split("## Cost")[0] == report.split("## Cost")[0]
