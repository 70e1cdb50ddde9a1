"""The committed reports hold no interval outside the range of the quantity it measures (issue 61): perplexity and
NLL >= 0, ratios of perplexities > 0, exact match and accuracy in [0, 1] (scripts/interval_ranges.py). Fast tier:
it reads files only."""
import json

from scripts.interval_ranges import ROOT, kind_of, scan, scan_json, scan_markdown


def test_no_committed_report_holds_an_interval_outside_its_quantitys_range():
    findings = scan([ROOT / "results", ROOT / "docs", ROOT / "README.md", ROOT / "CHANGELOG.md"])  # every page
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


def test_signed_quantities_within_their_range_are_not_flagged():
    text = "\n".join([
        "### Extrapolation penalty (nats): positions >= L, window loss minus L-window reference loss", "",
        "| variant | 2x | 16x |", "|---|---:|---:|", "| alibi | -0.002 [-0.003, -0.001] | +4.181 [+2.035, +6.326] |", "",
        "| positions | mean NLL [95% t over windows] | minus plain [paired by window] |", "|---|---:|---:|",
        "| 0-8k | 1.482 [0.008, 2.957] | -0.001 [-0.010, +0.009] |", "",
        "exact match: the model minus its window control (length, answer distance d in tokens)", "",
        "| encoding | 8x, d = 247 (8L) |", "|---|---:|", "| rope | -0.40 [-0.90, 0.10] |", "",
        "CoPE's perplexity difference paired by seed +0.153 [-0.089, +0.216] nats; sweep lowest - preset (paired) "
        "-0.02 [-0.05, 0.01]."])
    assert scan_markdown(text) == []
    assert scan_json({"grid": {"8x": {"difference": {"exact_match": {"mean": -0.4, "low": -1.2, "high": 0.4}}}},
                      "penalty": {"mean": -0.1, "low": -0.3, "high": 0.1}}) == []
    assert kind_of("ppl at longest") == "positive" and kind_of("penalty at longest (nats)") == "difference"
    assert kind_of("perplexity on the passkey texts, 1x / 4x") == "positive"


def test_the_four_classes_of_issue_73_are_planted_and_caught(tmp_path):
    """Rates out of [0, 1] in the map's table, paired exact-match differences beyond [-1, 1], zero-width differences
    (and, in a results file, a difference narrower than its parts), and t intervals over one or two windows."""
    report = tmp_path / "report.md"
    report.write_text("\n".join([
        "![the extrapolation map](map.png)", "",
        "| variant | text penalty at 16x | mqar exact match: model | mqar exact match: window control | "
        "mqar exact match: model - control (paired) |", "|---|---:|---:|---:|---:|",
        "| fox | -0.001 [-0.001, +0.000] | 0.60 [0.07, 1.13] | 0.38 [-0.10, 0.85] | +0.60 [+0.07, +1.00] |", "",
        "exact match: the model minus its window control (length, answer distance d in tokens)", "",
        "| encoding | 2x, d = 55 (2L) | 8x, d = 247 (8L) |", "|---|---:|---:|",
        "| fox | +0.70 [+0.16, +1.24] | +1.00 [+1.00, +1.00] |", "",
        "| positions | window | method | windows | mean NLL [95% t over windows] | minus plain [paired by window] |",
        "|---|---:|---|---:|---:|---:|",
        "| 0-8,192 | 16k (2x) | linear | 2 | 3.602 [0.000, 11.219] | +2.354 [-10.757, +15.466] |",
        "| 0-8,192 | 16k (2x) | none | 3 | 1.482 [0.008, 2.957] | (the reference) |"]))
    results = tmp_path / "results.json"
    results.write_text(json.dumps({
        "grid": {"fox": {"8x": {"4L": {
            "full": {"exact_match": {"mean": 1.0, "low": 0.99, "high": 1.0, "n": 3}},
            "window": {"exact_match": {"mean": 0.0, "low": 0.0, "high": 0.01, "n": 3}},
            "difference": {"exact_match": {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 3}}}}}},
        "rows": [{"method": "ntk", "windows": 2, "nll": 1.344, "nll_low": 0.0, "nll_high": 6.094},
                 {"method": "ntk", "windows": 3, "nll": 1.3, "nll_low": 0.9, "nll_high": 1.7}]}))
    findings = scan([tmp_path], root=tmp_path)
    found = {(f.line, f.kind, f.text) for f in findings if f.path == "report.md"}
    assert (5, "unit", "0.60 [0.07, 1.13]") in found and (5, "unit", "0.38 [-0.10, 0.85]") in found  # rates
    assert (11, "unit difference", "+0.70 [+0.16, +1.24]") in found  # a paired difference of rates past 1
    assert (11, "unit difference", "+1.00 [+1.00, +1.00]") in found  # zero width
    assert {(15, "t at 1 degree of freedom", text) for text in ("3.602 [0.000, 11.219]", "+2.354 [-10.757, +15.466]")} \
        <= found
    assert not [f for f in findings if f.line == 16]  # three windows: an interval is due
    in_json = {(f.kind, f.where) for f in findings if f.path == "results.json"}
    assert ("difference", "grid/fox/8x/4L/difference/exact_match") in in_json  # narrower than its parts
    assert ("t at 1 degree of freedom", "rows/0") in in_json and ("t at 1 degree of freedom", "rows/1") not in in_json


def test_a_paired_rate_difference_stays_in_range_and_is_never_narrower_than_its_parts():
    from eval.stats import Estimate, paired_rate_difference
    full, window = Estimate(1.0, 0.99, 1.0, 3), Estimate(0.0, 0.0, 0.01, 3)
    found = paired_rate_difference([1.0, 1.0, 1.0], full, window)  # every seed +1: the t interval has no width
    assert found.low < 1.0 and found.high == 1.0
    assert found.high - found.low >= max(full.high - full.low, window.high - window.low)
    wide = paired_rate_difference([0.9, 0.1, 0.95], Estimate(0.65, 0.0, 1.0, 3), Estimate(0.0, 0.0, 0.01, 3))
    assert -1.0 <= wide.low and wide.high <= 1.0


def test_prose_reads_the_quantity_named_earlier_in_the_sentence_and_flags_cut_and_zero_width_intervals():
    text = "\n".join([
        "Token accuracy at 2x puts ALiBi",
        "(0.84 [0.23, 1.44]) above NoPE, with RoPE (0.29 [-0.69, 1.27]) within noise; exact match 1.00 [1.00, 1.00].",
        "", "| positions | mean NLL [95% t over windows] |", "|---|---:|", "| 0-8k | 1.479 [0.000, 2.980] |", "",
        "Its perplexity fell, and the penalty +0.02 [-0.01, +0.05] stays signed; 64.71 [62.11, 67.41] is no rate."])
    found = {(f.line, f.kind, f.text) for f in scan_markdown(text)}
    assert found == {(2, "unit", "0.84 [0.23, 1.44]"), (2, "unit", "0.29 [-0.69, 1.27]"),
                     (2, "unit", "1.00 [1.00, 1.00]"), (6, "nonnegative", "1.479 [0.000, 2.980]")}
