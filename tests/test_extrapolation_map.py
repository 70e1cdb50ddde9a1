"""The extrapolation map of a comparison: its points against a hand-made task results file, the readings it gives,
and its figure."""
import dataclasses
import json

from eval.stats import Estimate
from experiments.compare.extrapolation_map import MapPoint, map_findings, map_points, map_section
from experiments.compare.use import UseSummary
from tests.test_compare_report import load_state


def estimate(mean, low, high, n=2):
    return {"mean": mean, "low": low, "high": high, "n": n}


def cell(full, window, difference):
    return {"distance": 128, **{part: {"exact_match": values, "token_accuracy": values}
                                for part, values in (("full", full), ("window", window), ("difference", difference))}}


def write_task(out, grid):
    folder = out / "tasks" / "mqar"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"task": "mqar", "length": 32, "grid": grid}))


def test_the_map_reads_use_from_the_task_file_and_harm_from_the_text(tmp_path):
    results = load_state(tmp_path)
    results.compare = dataclasses.replace(results.compare, tasks=["flipflop", "mqar"])
    write_task(tmp_path, {
        # rope beats its window control: the paired difference excludes 0
        "rope": {"8x": {"4L": cell(estimate(0.9, 0.8, 1.0), estimate(0.06, 0.0, 0.12), estimate(0.84, 0.7, 0.98))}},
        # alibi does not: the interval of the difference holds 0
        "alibi": {"8x": {"4L": cell(estimate(0.1, 0.0, 0.3), estimate(0.06, 0.0, 0.1), estimate(0.04, -0.1, 0.18))}},
        "rope+yarn": {"2x": {"L/2": cell(estimate(1, 1, 1), estimate(1, 1, 1), estimate(0, 0, 0))}}})  # no 8x/4L
    points = {point.label: point for point in map_points(results)}
    rope, alibi = points["rope"], points["alibi"]
    assert rope.use["mqar"] == Estimate(0.9, 0.8, 1.0, 2) and rope.control["mqar"] == Estimate(0.06, 0.0, 0.12, 2)
    assert rope.harm == results.variants["rope"].penalty_estimate(results.longest)
    assert rope.uses_far_context and not alibi.uses_far_context
    # the text penalties here straddle 0 beyond the flat band (rope) or lie within it (alibi)
    assert rope.verdict == "extrapolates (text within noise)"
    assert alibi.verdict == "window-like (text within noise)"
    assert "mqar" not in points["rope+yarn"].use  # no number at the map's cell
    assert "rope+logn" in points and not points["rope+logn"].use  # methods without a grid keep their text harm
    text = "\n".join(map_findings(list(points.values())))
    assert "extrapolates (text within noise): rope" in text and "window-like (text within noise): alibi" in text
    section = "\n".join(map_section(results))
    assert "![the extrapolation map](map.png)" in section and (tmp_path / "map.png").stat().st_size > 0
    assert "| rope | +0.002" in section and "| 0.90 [0.80, 1.00] | 0.06 [0.00, 0.12] | +0.84 [+0.70, +0.98] |" \
        in section


def test_the_readings_follow_harm_and_use():
    def point(harm, difference):
        return MapPoint("x", "x", "none", Estimate(*harm, 3), difference={"mqar": Estimate(*difference, 3)})

    flat, degrading, within_noise = (0.001, -0.004, 0.006), (0.3, 0.2, 0.4), (0.01, -0.05, 0.07)
    uses, does_not = (0.5, 0.3, 0.7), (0.02, -0.05, 0.09)
    assert point(flat, uses).verdict == "extrapolates"
    assert point(flat, does_not).verdict == "window-like"
    assert point(degrading, does_not).verdict == "degrades"
    assert point(degrading, uses).verdict == "uses the context past L but degrades on text"
    assert point(within_noise, does_not).verdict == "window-like (text within noise)"
    assert MapPoint("x", "x", "none", Estimate(*flat, 3)).verdict == "no use measured"


def summary(verdicts, distances=(32, 128, 256, 512), lengths=(64, 1024, 1024, 1024), reach=None):
    """The first column in windows of L (the positive control), the others at the longest length."""
    return UseSummary("x", list(distances), [Estimate(0.5, 0.1, 0.9, 3)] * len(distances), list(verdicts), reach,
                      list(lengths))


def test_the_readings_follow_the_text_models_own_use_when_measured():
    flat, degrading = Estimate(0.001, -0.004, 0.006, 3), Estimate(0.3, 0.2, 0.4, 3)

    def point(harm, verdicts, lookup=None):
        return MapPoint("x", "x", "none", harm, text=summary(verdicts), text_distance=256, trained=64,
                        difference={"mqar": Estimate(*lookup, 3)} if lookup else {})

    # use past L on the same weights decides, whatever the separate task models show
    assert point(flat, ["uses", "uses", "none", "none"], lookup=(0.02, -0.05, 0.09)).verdict == "extrapolates"
    assert point(flat, ["uses", "none", "none", "cannot tell"], lookup=(0.5, 0.3, 0.7)).verdict == "window-like"
    assert point(degrading, ["uses", "none", "none", "none"]).verdict == "degrades"
    assert point(degrading, ["uses", "cannot tell", "uses", "none"]).verdict == \
        "uses the context past L but degrades on text"
    # the positive control: no use even within L says nothing about past L
    assert point(flat, ["none", "none", "none", "none"]).verdict == "no use within L: cannot tell"
    p = point(flat, ["uses", "uses", "uses", "none"])
    assert p.text.reads_back() == 256 and p.text_use == Estimate(0.5, 0.1, 0.9, 3)
    assert "reads back to about 256 tokens (4L; use there +0.500 nats)" in "\n".join(map_findings([p]))


def test_the_map_section_draws_the_text_panel_from_the_use_probe(tmp_path):
    results = load_state(tmp_path)  # L = 16, longest 64
    distances, lengths = (8, 32, 64, 60), (16, 64, 64, 64)
    text_use = {"rope": summary(["uses", "uses", "none", "none"], distances, lengths),
                "alibi": summary(["uses", "uses", "uses", "uses"], distances, lengths)}
    section = "\n".join(map_section(results, text_use))
    assert "![the extrapolation map](map.png)" in section and (tmp_path / "map.png").stat().st_size > 0
    assert "text use 4L back (nats)" in section and "reads back to about 64 tokens (4L; use there" in section
    assert "| rope | +0.002" in section and "reads back to about 32 tokens (2L; use there" in section
    assert "Lookup panels" not in section  # no lookup task in this comparison
