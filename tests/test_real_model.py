"""experiments.real_model on a micro checkpoint: buckets, intervals over windows, dynamic NTK's tails, the passkey, the
prefix rule (a length-independent method is scored once), and resuming from the cache."""
import json

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from experiments.real_model import main
from model import Transformer
from model.checkpoint import save_checkpoint
from tests.conftest import micro_config


@pytest.fixture
def checkpoint(prepared_data, tmp_path):
    tokenizer = load_tokenizer(prepared_data)
    torch.manual_seed(0)
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=16))
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, model, tokenizer, {"trained_seq_len": 16, "step": 0})
    return folder


def run(checkpoint, book, out, *extra):
    return main(["--checkpoint", str(checkpoint), "--book", str(book), "--texts", "book", "--windows", "2",
                 "--lengths", "1x,2x,4x", "--dynamic-tail", "4", "--passkey-lengths", "160",
                 "--passkey-methods", "none", "--depths", "0.5", "--trials", "1",
                 "--use-methods", "none,sinks", "--use-lengths", "1x,4x", "--use-distances", "0.75x,1.25x", "--use-windows", "3", "--use-passages", "1", "--out", str(out),
                 *extra])


def test_report_rows_intervals_and_resuming(checkpoint, small_text_file, tmp_path):
    out = tmp_path / "report"
    methods = ["--methods", "none,yarn,dynamic,selfextend,logn"]
    assert run(checkpoint, small_text_file, out, *methods) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {(row["method"], row["length"], tuple(row["bucket"])): row for row in results["rows"]}
    plain = rows[("none", 64, (32, 64))]
    # two windows: their values and no interval (t at 1 degree of freedom says nothing); plain RoPE is the reference
    assert plain["windows"] == 2 and plain["nll_low"] is None and len(plain["values"]) == 2
    assert plain["nll"] == pytest.approx(np.mean(plain["values"])) and plain["vs_plain"] is None
    assert ("yarn", 64, (0, 16)) in rows and ("selfextend", 32, (16, 32)) in rows
    assert rows[("dynamic", 64, (60, 64))]["kind"] == "tail"
    assert ("yarn", 64, (60, 64)) in rows  # every method on dynamic NTK's tail positions
    cache = out / "cache" / "code" / "w0"
    # logn does not depend on the length: scored once at 4x, its 1x and 2x cells are that window's prefix
    assert (cache / "logn@64.npz").exists() and not (cache / "logn@32.npz").exists()
    assert ("logn", 64, (16, 32)) in rows
    # yarn at 1x is plain RoPE (factor 1): not scored again
    assert not (cache / "yarn@16.npz").exists() and (cache / "yarn@32.npz").exists()
    assert len(np.load(cache / "dynamic@64.npz")["losses"]) == 4
    assert results["passkey"][0]["length"] == 160 and "seconds" in results["passkey"][0]
    report = (out / "report.md").read_text()
    assert "mean NLL by position bucket" in report and "(2 windows: no interval)" in report
    # one trial per passkey cell: left out of the report, kept in results.json
    assert "Passkey retrieval" not in report and "fewer than 10 trials each are left out" in report
    assert all(row["nll_low"] >= 0 for row in results["rows"] if row["nll_low"] is not None)
    # use at 4x, plain and sinks at d = 12 and 20 (a window of L = 16 holds no passage of 8 tokens at d = 12: no
    # positive control); sinks' window is L - 4 = 12 keys, so d = 20 lies past its reach (the negative control)
    use = {(row["method"], row["length"], row["distance"]): row for row in results["use"]}
    assert set(use) == {("none", 64, 12), ("none", 64, 20), ("sinks", 64, 12), ("sinks", 64, 20)}
    assert use[("sinks", 64, 20)]["past_reach"] and not use[("sinks", 64, 12)]["past_reach"]
    assert use[("none", 64, 20)]["unit"] == "windows" and use[("none", 64, 20)]["n"] == 3
    assert "use of the text on the same weights" in report and "positive control: not measured" in report
    assert "negative control (sinks, d = 20 beyond its reach)" in report
    assert "selfextend: merged" in report and "none: sdpa" in report  # each method's attention path, as recorded
    assert (out / "nll_by_position.png").exists()
    stamps = {path: path.stat().st_mtime_ns for path in (out / "cache").rglob("*.npz")}
    assert run(checkpoint, small_text_file, out, *methods) == 0  # a rerun scores nothing again
    assert {path: path.stat().st_mtime_ns for path in (out / "cache").rglob("*.npz")} == stamps
    assert len(json.loads((out / "cache" / "invocations.json").read_text())) == 2
    (out / "report.md").unlink()  # --report-only: the report again from results.json and the use cache alone
    assert main(["--checkpoint", str(checkpoint), "--out", str(out), "--report-only"]) == 0
    again = (out / "report.md").read_text()
    assert "use of the text on the same weights" in again and "Use measurements: " in again
    assert again.count("Use measurements: ") == 1
    # --join-documents: the same windows and passages with each document end replaced by a newline; this text is
    # one document, so nothing changes, passage by passage
    assert run(checkpoint, small_text_file, out, *methods, "--join-documents") == 0
    use = json.loads((out / "results.json").read_text())["use"]
    as_is = {(r["method"], r["length"], r["distance"]): r for r in use if r["text"] == "code"}
    joined = {(r["method"], r["length"], r["distance"]): r for r in use if r["text"] == "code-joined"}
    assert set(joined) == set(as_is)
    assert all(joined[key]["passages"] == as_is[key]["passages"] for key in joined)
    assert all(r["across_documents"] == 0 and r["passages_scored"] == 3 for r in joined.values())
    report = (out / "report.md").read_text()
    paired = report.split("code-joined against code")[1].split("\n\n")[1].splitlines()[2:]  # the table's rows
    assert len(paired) == len(joined) and all(row.endswith("| +0.000 [+0.000, +0.000] |") for row in paired)


def test_another_window_layout_is_refused(checkpoint, small_text_file, tmp_path, capsys):
    out = tmp_path / "report"
    assert run(checkpoint, small_text_file, out, "--methods", "none", "--passkey-lengths", "") == 0
    assert main(["--checkpoint", str(checkpoint), "--book", str(small_text_file), "--texts", "book", "--windows", "3",
                 "--lengths", "4x", "--passkey-lengths", "", "--out", str(out)]) == 2
    assert "holds cells of other windows" in capsys.readouterr().err
