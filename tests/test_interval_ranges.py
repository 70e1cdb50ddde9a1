"""The committed reports hold no interval outside the range of the quantity it measures (issue 61): perplexity and
NLL >= 0, ratios of perplexities > 0, exact match and accuracy in [0, 1] (scripts/interval_ranges.py). Fast tier:
it reads files only."""
import json

from scripts.interval_ranges import ROOT, kind_of, scan, scan_json, scan_markdown


def test_no_committed_report_holds_an_interval_outside_its_quantitys_range():
    findings = scan([ROOT / "docs", ROOT / "README.md"])  # every committed report
    assert not findings, "\n".join(str(f) for f in findings)


def test_the_scanner_catches_a_planted_interval_in_a_table_in_prose_and_in_json(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("\n".join([
        "### Perplexity (nonoverlapping windows)", "",
        "| variant | 1x | 16x |", "|---|---:|---:|",
        "| rope | 71.68 [70.74, 72.63] | 9058.61 [-6010.65, 24127.86] |", "",
        "Exact match at each multiple of L = 32 over seeds [1, 2, 3].", "",
        "| mqar | 1x | 2x |", "|---|---|---|",
        "| fox | 0.66 [-0.70, 2.03] | 0.50 [0.10, 0.90] |", "",
        "### Perplexity relative to the same variant at 1x (secondary)", "",
        "| variant | 1x | 16x |", "|---|---:|---:|",
        "| none | 1.00 [1.00, 1.00] | 126.78 [-83.80, 337.36] |", "",
        "FoX's 1x exact match 0.47 [-0.08, 1.02] is bounded by what it learned."]))
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"cells": [{"label": "none", "ppl": {"mean": 9.0, "low": -1.0, "high": 20.0},
                                              "ratio": {"mean": 1.0, "low": 0.9, "high": 1.1}}]}))
    findings = scan([tmp_path], root=tmp_path)
    found = {(f.path, f.line, f.text) for f in findings}
    assert ("report.md", 5, "9058.61 [-6010.65, 24127.86]") in found
    assert ("report.md", 11, "0.66 [-0.70, 2.03]") in found
    assert ("report.md", 17, "126.78 [-83.80, 337.36]") in found
    assert ("report.md", 19, "0.47 [-0.08, 1.02]") in found
    assert [f.where for f in findings if f.path == "results.json"] == ["cells/0/ppl"]
    assert len(findings) == 5
    assert "report.md:5: positive interval 9058.61 [-6010.65, 24127.86]" in str(findings[0])


def test_signed_quantities_are_never_flagged():
    text = "\n".join([
        "### Extrapolation penalty (nats): positions >= L, window loss minus L-window reference loss", "",
        "| variant | 2x | 16x |", "|---|---:|---:|", "| alibi | -0.002 [-0.003, -0.001] | +4.181 [+2.035, +6.326] |", "",
        "| positions | mean NLL [95% t over windows] | minus plain [paired by window] |", "|---|---:|---:|",
        "| 0-8k | 1.482 [0.008, 2.957] | -0.001 [-0.010, +0.009] |", "",
        "exact match: the model minus its window control (length, answer distance d in tokens)", "",
        "| encoding | 8x, d = 247 (8L) |", "|---|---:|", "| rope | -0.40 [-1.20, 0.40] |", "",
        "CoPE's perplexity difference paired by seed +0.153 [-0.089, +0.216] nats; sweep lowest - preset (paired) "
        "-0.02 [-0.05, 0.01]."])
    assert scan_markdown(text) == []
    assert scan_json({"grid": {"8x": {"difference": {"exact_match": {"mean": -0.4, "low": -1.2, "high": 0.4}}}},
                      "penalty": {"mean": -0.1, "low": -0.3, "high": 0.1}}) == []
    assert kind_of("ppl at longest") == "positive" and kind_of("penalty at longest (nats)") is None
    assert kind_of("perplexity on the passkey texts, 1x / 4x") == "positive"
