"""The comparison's use probe: how many windows each length gets, and the priming control over seeds and windows."""
import pytest

from experiments.compare.config import CompareConfig
from experiments.compare.use import probe_windows


def test_the_positive_control_reads_as_many_tokens_as_the_longest_windows():
    compare = CompareConfig(lengths=["1x", "4x", "16x"], use_windows=32)
    # 32 windows of 1,025 tokens hold 32,800 tokens: 504 windows of 65
    assert probe_windows(compare, 64, 10**6) == {64: 504, 1024: 32}
    # as many as the held-out text holds, and never fewer than compare.use_windows
    assert probe_windows(compare, 64, 65 * 100) == {64: 100, 1024: 32}
    assert probe_windows(compare, 64, 65 * 10) == {64: 32, 1024: 32}


def test_recalibrate_rereads_a_committed_use_table_under_the_calibrated_rule(tmp_path):
    """A use table of three seeds: a cell shown above 0 by its own interval (t = 5.5 at 2 degrees of freedom) is
    'cannot tell' among 80 cells (Holm), reach needs every nearer distance, and the window control's negative
    control counts only distances its layers cannot relay."""
    import json

    import pytest

    from experiments.compare.recalibrate import recalibrate

    folder = tmp_path / "compare"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"settings": {
        "trained_length": 64, "compare": {"seeds": [1, 2, 3]}, "shared": {"model": {"n_layers": 4}}}}))
    header = ("| variant | d = 32 (0.5L) in 64 | d = 32 (0.5L) in 1,024 | d = 128 (2L) in 1,024 | d = 512 (8L) in "
              "1,024 | how far back |")
    strong = "+2.000 [+1.900, +2.100] uses"
    (folder / "report.md").write_text("\n".join([
        "### Use of the text past L, on the same weights", "",
        "Repeated passages in held-out windows (eval/use.py): x. Verdict: 'uses' (the 95% interval above 0), 'none' "
        "(the interval within +-0.05 nats), 'negligible' (both), else 'cannot tell'. y", "", header,
        "|---|---:|---:|---:|---:|---|",
        f"| rope | +0.190 [+0.124, +0.257] uses | {strong} | +0.162 [+0.035, +0.290] uses | {strong} | x |",
        f"| rope+window | +0.190 [+0.124, +0.257] uses | {strong} | +0.001 [-0.010, +0.012] none | "
        "+0.001 [-0.004, +0.006] none | x |", "",
        "- Negative control (rope+window, attention limited to 64 keys): past its reach d = 128 none, d = 512 none "
        "(passes).", ""]))
    found = recalibrate(folder)
    verdicts = {(c.variant, c.distance, c.length): c.verdict for c in found["cells"]}
    assert verdicts[("rope", 32, 1024)] == "uses" and verdicts[("rope", 512, 1024)] == "uses"
    assert verdicts[("rope", 128, 1024)] == "cannot tell"  # p = 0.016 one-sided, above Holm's 0.025 / 5
    assert found["reaches"]["rope"] == 32  # 512 reads "uses" but 128, nearer, does not
    assert found["margins"]["rope"] == pytest.approx(0.05)  # a tenth of +0.190 is below the floor
    assert [(c.variant, c.distance) for c in found["impossible"]] == [("rope+window", 512)]  # 4 x 63 = 252 < 512
    report = (folder / "report.md").read_text()
    assert "Holm-corrected" in report and "reads back to about 32 tokens" in report
    assert "which its layers can relay about 252 tokens back): past that, d = 512 none (passes)" in report


def test_the_priming_control_splits_a_variants_use_over_seeds_and_windows():
    import numpy as np

    from experiments.compare.use import summarise_use, use_section
    rng = np.random.default_rng(0)

    def entry(length, distances, use, presence):
        shape = (8, len(distances), 4)  # windows, distances, passages
        return {"method": "none", "length": length, "distances": distances, "reach": None, "recurrence": [],
                "passages": (np.asarray(use)[None, :, None] + rng.normal(0, 0.05, shape)).tolist(),
                "presence": (np.asarray(presence)[None, :, None] + rng.normal(0, 0.05, shape)).tolist()}

    # within L copying (all order); 2L back a use that is all presence: priming
    found = {"rope": {seed: {"results": [entry(64, [32], [1.0], [0.0]), entry(256, [32, 128], [1.0, 0.3], [0.0, 0.3])]}
                      for seed in (1, 2, 3)}}
    summary = summarise_use(found, 0.05)["rope"]
    at = dict(zip(zip(summary.lengths, summary.distances), zip(summary.presence, summary.order)))
    presence, order = at[(256, 128)]
    assert presence.mean == pytest.approx(0.3, abs=0.03) and abs(order.mean) < 0.03
    presence, order = at[(256, 32)]
    assert abs(presence.mean) < 0.03 and order.mean == pytest.approx(1.0, abs=0.03)
    lines = use_section({"rope": summary}, 64, 256, 0.05)
    table = lines[lines.index("| variant | distance | use | presence | order |"):]
    assert len([line for line in table if line.startswith("| rope | 128 (2L) in 256 |")]) == 1
    # within L, the positive control (windows of L) and the same distance in the long windows: all order
    assert [line.split(" | ")[1] for line in table if line.startswith("| rope | 32 ")] == ["32 (0.5L) in 64",
                                                                                           "32 (0.5L) in 256"]


def test_use_against_the_tokens_trained_carries_the_order_within_l(monkeypatch, tmp_path):
    import numpy as np

    from eval.stats import Estimate
    from experiments.compare.use import budget_section, summarise_use
    rng = np.random.default_rng(1)

    def found(order):  # within L a use of 1.0, of which `order` is reading in order
        def entry(length, distances):
            shape = (8, len(distances), 4)
            return {"method": "none", "length": length, "distances": distances, "reach": None, "recurrence": [],
                    "passages": (1.0 + rng.normal(0, 0.05, shape)).tolist(),
                    "presence": (1.0 - order + rng.normal(0, 0.05, shape)).tolist()}
        return {"rope": {seed: {"results": [entry(64, [32]), entry(256, [32, 128])]} for seed in (1, 2, 3)}}

    by_step = {100: summarise_use(found(0.0), 0.05), 200: summarise_use(found(0.8), 0.05)}
    lines = budget_section(by_step, 2048, 64, {"rope": {200: Estimate(0.1, 0.0, 0.2, 3)}}, 256)
    header = next(line for line in lines if line.startswith("| variant | tokens trained"))
    assert "order within L" in header
    rows = [line.split(" | ") for line in lines if line.startswith("| rope | ")]
    column = header.split(" | ").index("order within L")
    assert [float(row[column].split()[0]) for row in rows] == pytest.approx([0.0, 0.8], abs=0.05)
    # the figure: a panel of order within L beside use within L, its points the table's
    from eval import figures
    from experiments.compare.use import plot_use_budget
    saved = {}
    monkeypatch.setattr(figures, "save", lambda figure, path, *a, **k: saved.setdefault("figure", figure))
    plot_use_budget(by_step, 2048, 64, tmp_path / "use_budget.png")
    panels = {axis.get_title(): axis for axis in saved["figure"].axes}
    assert "order within L (L = 64)" in panels and "use within L (L = 64)" in panels
    [line] = panels["order within L (L = 64)"].get_lines()[:1]
    assert list(line.get_ydata()) == pytest.approx([0.0, 0.8], abs=0.05)


def test_the_max_column_is_shown_but_not_counted_in_how_far_back():
    import numpy as np

    from experiments.compare.use import summarise_use
    rng = np.random.default_rng(2)

    def entry(length, distances):
        shape = (8, len(distances), 4)
        return {"method": "none", "length": length, "distances": distances, "reach": None, "recurrence": [],
                "passages": (1.0 + rng.normal(0, 0.05, shape)).tolist()}

    found = {"rope": {seed: {"results": [entry(64, [32]), entry(256, [32, 128, 223])]} for seed in (1, 2, 3)}}
    assert summarise_use(found, 0.05)["rope"].reads_back() == 223  # every column reads "uses"
    summary = summarise_use(found, 0.05, pinned=True)["rope"]
    assert summary.pinned == 223 and summary.reads_back() == 128  # the window-start column is not a reach
    assert summary.at(223)[1] == "uses"  # still shown, with its verdict


def test_the_use_probe_that_cannot_fit_stops_before_training():
    """At L = 256 the 16x windows are 4,097 tokens: 176,518 held-out tokens hold 43, fewer than 64 windows. The
    comparison says so before it trains (it used to fail after an hour of training)."""
    from errors import ConfigError
    from experiments.compare.use import check_use_windows

    compare = CompareConfig(probes=["use"], use_windows=64, lengths=["1x", "16x"])
    with pytest.raises(ConfigError, match="holds 43: lower compare.use_windows to 43"):
        check_use_windows(compare, 256, 176_518)
    check_use_windows(compare, 64, 176_518)  # 171 windows of 1,025 tokens: fits
    check_use_windows(CompareConfig(probes=[], use_windows=64, lengths=["1x", "16x"]), 256, 176_518)  # no probe
