"""experiments/compare_report.py: the comparison's report rendered from a saved study folder against its expected
text, and its parts on hand-made numbers: the findings and the papers' claims, the probe sections, the figures'
panels and colours, the use of the text past L (its calibrated verdicts, the priming control, use against the
tokens trained) and the extrapolation map.

tests/fixtures/compare_report/study/ is a micro comparison's study folder (study.json, records/, invocations.jsonl):
6 encodings incl. a named variant (p-rope), RoPE scalings, log-n and clamp, 2 seeds, a model kept at half of
training, every probe and a task. Its records are trimmed (each figure's curves cut to 8 points, which only the
figures read) and its source is named corpus.txt. report.md and table.md beside it are its report as rendered by
`python -m experiments.compare --report-only`. After a deliberate change of the report's text, rewrite them with
`python -m tests.test_compare_report` and review the diff; `python -m tests.test_compare_report --records` measures
the study folder again first (about 2 minutes on 2 cores).
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from eval import figures
from eval.stats import Estimate, Spread, seeds_and_trials, wilson_interval
from eval.use import UseSummary, check_fleet_windows, fleet_windows, summarise_fleet
from eval.verdicts import ratio_word, threshold_claim, use_margin
from experiments import tasks
from experiments.compare import STUDY
from experiments.compare_report import (
    Comparison,
    MapPoint,
    Variant,
    budget_section,
    claim_findings,
    committed_use,
    findings,
    map_findings,
    map_points,
    map_section,
    method_findings,
    panel_groups,
    passkey_section,
    use_section,
    write_figures,
)
from experiments.engine import key, load_records, main
from experiments.render import cell, published
from model.encodings import POSITION_ENCODINGS
from model.methods import METHODS, label
from tests.conftest import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "compare_report"
FIXTURE_SETTINGS = [  # the micro comparison whose study folder is the fixture (with --compare.source and --out)
    "--config", "configs/compare.toml", "--preset", "quick", "--compare.val_fraction=0.3", "--model.dim=32",
    "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=16",
    "--train.max_steps=6", "--train.batch_size=4", "--train.eval_interval=3", "--train.eval_batches=1",
    "--train.log_interval=2", "--compare.vocab_size=300", "--compare.eval_tokens=512",
    "--compare.methods=yarn,dynamic,logn,clamp", "--compare.lengths=1x,2x,4x", "--compare.seeds=1,2",
    "--compare.encodings=sinusoidal,learned,t5,alibi,rope,p-rope", "--compare.snapshots=0.5",
    "--compare.snapshot_methods=clamp,yarn", "--compare.probes=attention,induction,passkey,use",
    "--compare.probe_lengths=1x,16x", "--compare.probe_tokens=256", "--compare.passkey_trials=2",
    "--compare.use_distances=0.5x,2x,max", "--compare.use_windows=3", "--compare.tasks=flipflop",
    "--compare.task_steps=3", "--workers", "1", "--threads", "1"]
CURVE_POINTS = 8  # what the fixture keeps of each curve only a figure reads


def rendered(out: Path) -> Path:
    """The fixture's study folder copied to `out`, its report rendered there by the engine's --report-only."""
    shutil.copytree(FIXTURE / "study", out)
    assert main("experiments.compare", ["--report-only", "--out", str(out)]) == 0
    return out


def test_the_report_of_a_saved_study_reads_as_expected(tmp_path):
    out = rendered(tmp_path / "cmp")
    c = Comparison(load_records(STUDY, out))
    assert c.trained == 16 and c.lengths == [16, 32, 64] and c.probe_offsets == [0, 16, 48, 240]
    report = (out / "report.md").read_text()
    for heading in ("## Setup", "### Position-shift probe", "### Extrapolation against training tokens",
                    "### Use of the text past L, on the same weights", "The extrapolation map on the same weights",
                    "### Attention diagnostics", "### Induction probe", "### Passkey retrieval", "### Task: flipflop",
                    "## What this shows", "Against the ALiBi paper", "Inference-time methods against"):
        assert heading in report, heading
    expected = (FIXTURE / "report.md").read_text()
    assert report.splitlines() == expected.splitlines()  # line by line first: a readable diff
    assert report == expected
    assert (out / "table.md").read_text() == (FIXTURE / "table.md").read_text()
    for name in ("plot", "penalty", "position_loss", "train_curves", "snapshots", "attention",
                 "tasks/flipflop/flipflop"):
        assert (out / f"{name}.png").stat().st_size > 0, name


def test_the_probe_sections_list_the_encodings_in_the_comparisons_order(tmp_path):
    out = rendered(tmp_path / "cmp")
    settings = json.loads((out / "study.json").read_text())["settings"]
    report = (out / "report.md").read_text()
    section = report.split("### Induction probe")[1].split("###")[0]
    rows = [line.split(" | ")[0].strip("| ") for line in section.splitlines() if line.startswith("| ")][1:]
    assert rows == [e for e in settings["encodings"] if e in rows] and len(rows) == len(settings["encodings"])


def test_every_papers_claim_names_what_a_comparison_can_train():
    """Each claim of experiments/published compares rows a comparison makes: an encoding or a variant of
    configs/compare.toml, optionally under an inference-time method (NAME+METHOD); each names its source."""
    variants = tomllib.loads((ROOT / "configs" / "compare.toml").read_text())["compare"]["variants"]

    def makes(row: str) -> bool:
        name, _, method = row.partition("+")
        return (name in POSITION_ENCODINGS or name in variants) and (not method or method in METHODS)

    claims = published("encoding_claims")
    assert len(claims) > 20
    for claim in claims:
        assert makes(claim["variant"]) and makes(claim["baseline"]), claim
        assert claim["where"] in ("1x", "longest") and claim["expected"] in ("lower", "not higher"), claim
    paper = published("alibi_paper")
    assert all(makes(name) for entry in paper for name in entry.get("variants", [entry.get("variant", "rope")]))
    assert all(entry["source"] for entry in claims + paper)


# ----------------------------------------------------------------------------------------------- findings

def variant(name, values_by_length, method="none"):
    """A variant with the given perplexities per length, one per seed (seeds 0, 1, ...)."""
    result = Variant(name, method, name if method == "none" else f"{name}+{method}")
    for length, values in values_by_length.items():
        result.nll[length] = {seed: math.log(value) for seed, value in enumerate(values)}
    return result


def comparison(variants, lengths=(16, 64), trained=16, **more):
    """What the findings read of a Comparison."""
    return SimpleNamespace(variants=variants, lengths=list(lengths), trained=trained, longest=max(lengths),
                           probe_offsets=[], **more)


def test_orderings_are_stated_only_where_the_intervals_separate():
    variants = {"alibi": variant("alibi", {16: [10.0, 10.1, 9.9], 64: [10.0, 10.1, 9.9]}),
                "rope": variant("rope", {16: [10.05, 10.2, 9.95], 64: [10.05, 10.2, 9.95]}),
                "sinusoidal": variant("sinusoidal", {16: [20.0, 20.5, 19.5], 64: [20.0, 20.5, 19.5]})}
    text = "\n".join(findings(comparison(variants)))
    assert "- Perplexity at 1x, best to worst: alibi (10.0) ≈ rope (10.1) < sinusoidal (20.0)." in text


def test_claims_follow_the_interval_not_the_mean():
    assert threshold_claim(Estimate(2.5, 2.2, 2.8, 3), 2.0, holds_above=True) == "reproduced"
    assert threshold_claim(Estimate(1.5, 1.2, 1.8, 3), 2.0, holds_above=True) == "not reproduced"
    assert threshold_claim(Estimate(2.1, 1.8, 2.4, 3), 2.0, holds_above=True).startswith("within noise")
    assert threshold_claim(Estimate(1.05, 1.0, 1.08, 3), 1.10, holds_above=False) == "reproduced"
    assert threshold_claim(Estimate(2.1, None, None, 1), 2.0, holds_above=True).startswith("undetermined")
    assert threshold_claim(None, 2.0, True) == "not measured here"


def test_a_negligible_paired_change_is_not_called_better_or_worse():
    assert ratio_word(Estimate(1.0001, 1.00005, 1.00015, 3)) == "the same within 1%"
    assert ratio_word(Estimate(0.95, 0.93, 0.97, 3)) == "better"
    assert ratio_word(Estimate(1.05, 1.02, 1.08, 3)) == "worse"
    assert ratio_word(Estimate(1.0, 0.97, 1.03, 3)) == "within noise"


def test_findings_name_the_penalty_side_and_the_paper_checks():
    rows = {}
    for name, ppl, penalty in (("alibi", [10, 10.2, 9.8], [0.0, 0.004, -0.004]), ("rope", [10, 13, 11], [0.5, 0.6, 0.4])):
        v = variant(name, {16: ppl, 64: [2 * p if name == "rope" else p for p in ppl]})
        v.penalty[64] = {seed: np.full(8, value) for seed, value in enumerate(penalty)}
        rows[name] = v
    text = "\n".join(findings(comparison(rows)))
    assert "Degrade beyond L (interval above 0): rope (+0.500)." in text
    assert "Flat (interval within +-0.01 nats, i.e. +-1% perplexity): alibi (+0.000)." in text
    assert "ALiBi stays flat (within 10%) out to 4x: reproduced" in text
    assert "rotary degrades (more than 10%) by 4x: reproduced" in text
    assert "T5 bias holds (within 25%) to 4x: not measured here" in text


def test_one_seed_states_no_penalty_side_however_many_windows_agree():
    """One trained model per encoding: its windows agree closely (a narrow interval over windows), but another
    training run of the same seed can move RoPE's 16x penalty by 0.3 nats (docs/results.md), so nothing is claimed."""
    rows = {}
    for name, penalty in (("alibi", 0.0), ("rope", 0.7)):
        v = variant(name, {16: [10.0], 64: [12.0]})
        v.penalty[64] = {0: np.random.default_rng(0).normal(penalty, 0.01, 64)}
        rows[name] = v
    assert rows["rope"].penalty_estimate(64).low is None
    text = "\n".join(findings(comparison(rows)))
    assert "Degrade beyond L (interval above 0): none." in text
    assert "Flat (interval within +-0.01 nats, i.e. +-1% perplexity): none." in text
    assert "Within noise of 0: none. One seed, so no interval: alibi (+0.0" in text
    assert "rope (+0.7" in text.split("One seed, so no interval:")[1]
    assert "rope +0.7" in text and "nats: one seed, no interval" in text


def test_method_findings_pair_seeds_against_plain_and_yarn():
    """Seeds differ a lot between themselves, but the method's change on each seed's model is consistent: paired by
    seed it is 'better' than plain; against yarn the per-seed ratios straddle 1: 'within noise'."""
    plain = variant("rope", {64: [20.0, 40.0, 80.0], 256: [50.0, 90.0, 200.0]})
    yarn = variant("rope", {64: [15.0, 33.0, 60.0], 256: [30.0, 60.0, 100.0]}, "yarn")
    rerope = variant("rope", {64: [16.0, 31.0, 63.0], 256: [29.0, 63.0, 98.0]}, "rerope")
    text = "\n".join(method_findings(comparison({v.label: v for v in (plain, yarn, rerope)}, (16, 64, 256))))
    assert "rope+rerope: 4x vs plain: 0.787 [" in text  # exp of the mean log ratio (0.8, 0.775, 0.7875)
    assert "better" in text.split("4x vs yarn")[0]
    assert "16x vs yarn" in text and "within noise" in text.split("16x vs yarn")[1]
    assert "rope+yarn:" not in text  # YaRN is the baseline, not a finding


def test_newer_paper_claims_are_judged_by_their_intervals():
    """Extrapolation claims rest on the penalty difference paired by seed and window, 1x claims on the perplexity
    ratio paired by seed."""
    rng = np.random.default_rng(0)

    def with_penalty(name, ppl_1x, penalty, spread=0.002):
        result = variant(name, {16: ppl_1x, 64: [130, 140, 150]})
        result.penalty[64] = {seed: penalty + spread * rng.standard_normal(16) for seed in range(3)}
        return result

    variants = {"rope": with_penalty("rope", [100, 110, 120], 0.10),
                "xpos": with_penalty("xpos", [100, 110, 120], 0.05),  # lower penalty: agrees
                "rnope-swa": with_penalty("rnope-swa", [100, 110, 120], 0.20),  # higher: disagrees
                "irope": with_penalty("irope", [100, 110, 120], 0.10, spread=0.05),  # overlaps: cannot tell
                "p-rope": with_penalty("p-rope", [100.2, 110.1, 119.9], 0.10),  # 1x: same within 1%: agrees
                "cope": with_penalty("cope", [110, 121, 132], 0.10)}  # 1x: 1.1x in every seed: disagrees
    lines = "\n".join(claim_findings(comparison(variants)))
    assert "xPos extrapolates better than RoPE (Sun et al. 2022): penalty at 4x xpos +0.050" in lines
    assert lines.count("; agrees") == 2 and "kerple" not in lines  # not compared: no statement
    assert "rnope-swa +0.200" in lines and "disagrees (the paired difference excludes 0 the other way)" in lines
    assert "difference paired by seed and window -0.050 [-0.052, -0.047]" in lines
    assert "cannot tell (the paired difference's interval holds 0)" in lines
    assert "cope / rope perplexity at 1x = 1.100 [1.100, 1.100]x; disagrees" in lines


def test_findings_name_every_separated_pair_and_order_the_encodings_as_trained_when_methods_are_there():
    """A chain of '≈' can join two variants whose intervals separate (overlap is not transitive): the separated
    pairs are listed; with methods, the orderings hold the encodings as trained only."""
    rows = {name: variant(name, {16: ppl, 64: ppl}) for name, ppl in
            (("alibi", [10.0, 10.1, 9.9]), ("rope", [10.6, 10.7, 10.5]), ("none", [11.2, 11.3, 11.1]))}
    text = "\n".join(findings(comparison(rows)))
    assert "Perplexity at 1x, best to worst: alibi (10.0) < rope (10.6) < none (11.2)." in text
    assert "(better < worse): alibi < rope, none; rope < none." in text
    wide = {name: variant(name, {16: ppl, 64: ppl}) for name, ppl in
            (("alibi", [10.0, 10.2, 9.8]), ("rope", [10.5, 11.5, 9.5]), ("none", [11.0, 11.2, 10.8]))}
    text = "\n".join(findings(comparison(wide)))
    assert "alibi (10.0) ≈ rope (10.5) ≈ none (11.0)" in text and "(better < worse): alibi < none." in text
    yarn = variant("rope", {16: [10.6, 10.7, 10.5], 64: [9.0, 9.1, 8.9]}, "yarn")
    text = "\n".join(findings(comparison({**rows, "rope+yarn": yarn})))
    assert "rope+yarn" not in text.split("(The encodings as trained;")[0]  # orderings: as trained only
    assert "Perplexity at 4x, best to worst: alibi (10.0) < rope (10.6) < none (11.2)." in text


def test_findings_give_the_absolute_encodings_1x_gap_and_check_the_papers_order_of_degradation():
    """The sinusoid (absolute) gets its 1x perplexity against RoPE's next to its extrapolation claims; the ALiBi
    paper's order (sinusoidal > rope > t5 > alibi by the penalty) is checked pair by pair: here the sinusoid and
    RoPE separate as the paper has them, RoPE and T5 are reversed, T5 and ALiBi agree."""
    rows = {}
    for name, ppl, penalty in (("sinusoidal", [15.0, 15.2, 14.8], [0.9, 1.0, 1.1]),
                               ("rope", [10.0, 10.2, 9.8], [0.3, 0.35, 0.4]),
                               ("t5", [10.0, 10.1, 9.9], [0.6, 0.65, 0.7]),
                               ("alibi", [10.0, 10.2, 9.8], [0.0, 0.004, -0.004])):
        v = variant(name, {16: ppl, 64: ppl})
        v.penalty[64] = {seed: np.full(8, value) for seed, value in enumerate(penalty)}
        rows[name] = v
    text = "\n".join(findings(comparison(rows)))
    assert "sinusoidal +1.000 [" in text and "(absolute encoding; its 1x perplexity is 1.50x RoPE's, not within 10%)" \
        in text
    assert "rope +0.350" in text and "rope +0.350 [+0.226, +0.474] nats: positions beyond L cost more than the " \
        "longer context gives;" in text  # a relative encoding gets no gap
    assert ("the order of degradation beyond L (sinusoidal > rotary > T5 > ALiBi), by the penalty at 4x: "
            "sinusoidal (+1.000) > rope (+0.350, difference +0.650 [+0.526, +0.774]): agrees; rope (+0.350) > t5 "
            "(+0.650, difference -0.300 [-0.300, -0.300]): reversed; t5 (+0.650) > alibi (+0.000, difference +0.650 "
            "[+0.521, +0.779]): agrees.") in text


def test_the_passkey_section_gives_an_interval_over_seeds_not_pooled_trials():
    by_seed = {("rope", 1): 10, ("rope", 2): 0, ("alibi", 1): 3, ("alibi", 2): 3}  # successes of 3 x 10 per length
    found: dict[str, list] = {}
    for (encoding, _), successes in by_seed.items():
        rows = [{"depth": d, "accuracy": (successes if d == 0.5 else 0) / 10, "trials": 10} for d in (0.1, 0.5, 0.9)]
        found.setdefault(encoding, []).append({"1x": rows, "4x": {"error": "too short"}})
    c = SimpleNamespace(probe_records=lambda probe: found if probe == "passkey" else {},
                        settings=SimpleNamespace(probe_lengths=["1x", "4x"], passkey_trials=10))
    table = {line.split(" | ")[0].strip("| "): line for line in passkey_section(c) if line.startswith("| ")}
    split, agree = seeds_and_trials([10, 0], [30, 30]), seeds_and_trials([3, 3], [30, 30])
    assert table["rope"] == f"| rope | {split.format()} | n/a |"
    assert table["alibi"] == f"| alibi | {agree.format()} | n/a |"
    assert split.high - split.low > 2 * (wilson_interval(10, 60).high - wilson_interval(10, 60).low)
    assert (agree.low, agree.high) == (wilson_interval(6, 60).low, wilson_interval(6, 60).high)


# ------------------------------------------------------------------------------------------------ figures

LENGTHS = [64, 128, 256]


def drawn_variant(encoding: str, method: str = "none", shift: float = 0.0) -> Variant:
    v = Variant(encoding=encoding, method=method, label=label(encoding, method))
    for length in LENGTHS:
        v.nll[length] = {seed: 4.0 + shift + 0.01 * seed + length / 1000 for seed in (1, 2, 3)}
    v.curves = {seed: list(np.full(256, 0.01 * seed + shift)) for seed in (1, 2, 3)}
    return v


def as_dict(*variants: Variant) -> dict[str, Variant]:
    return {v.label: v for v in variants}


def figure_comparison(variants: dict[str, Variant], out: Path) -> SimpleNamespace:
    """What write_figures reads of a Comparison: L = 128, lengths 0.5x to 2x, no training curves or kept models."""
    return SimpleNamespace(out=out, trained=128, variants=variants, lengths=LENGTHS, penalty_lengths=[256],
                           longest=256, settings=SimpleNamespace(encodings=[]), training=lambda encoding: [],
                           snapshots={})


@pytest.fixture
def drawn(monkeypatch):
    """figure file name -> the visible axes of the figure handed to figures.save (then saved as usual)."""
    seen = {}
    save = figures.save

    def keep(figure, path, *rest, **options):
        result = save(figure, path, *rest, **options)
        seen[Path(path).name] = [axis for axis in figure.axes if axis.get_visible()]
        return result

    monkeypatch.setattr(figures, "save", keep)
    return seen


def test_without_methods_every_variant_shares_one_panel():
    variants = as_dict(drawn_variant("rope"), drawn_variant("alibi"))
    assert panel_groups(variants) == [("", variants)]


def test_with_methods_each_encoding_that_has_some_gets_a_panel_after_the_encodings_as_trained():
    variants = as_dict(drawn_variant("rope"), drawn_variant("rope", "yarn"), drawn_variant("alibi"),
                       drawn_variant("rope", "window"), drawn_variant("alibi", "logn"), drawn_variant("none"))
    groups = panel_groups(variants)
    assert [title for title, _ in groups] == ["every encoding as trained", "rope under each method",
                                              "alibi under each method"]
    assert list(groups[0][1]) == ["rope", "alibi", "none"]
    assert list(groups[1][1]) == ["rope", "rope+yarn", "rope+window"]  # as trained first, then the methods in order
    assert list(groups[2][1]) == ["alibi", "alibi+logn"]


def test_small_multiples_have_one_panel_per_group_with_its_own_legend_and_method_colours(tmp_path, drawn):
    variants = as_dict(drawn_variant("rope"), drawn_variant("rope", "yarn", 0.1), drawn_variant("rope", "window", -0.1),
                       drawn_variant("alibi"), drawn_variant("alibi", "logn", 0.05))
    write_figures(figure_comparison(variants, tmp_path))
    for name in ("plot.png", "position_loss.png"):
        axes = drawn[name]
        assert len(axes) == 3, name
        labels = [axis.get_legend_handles_labels()[1] for axis in axes]
        assert labels == [["rope", "alibi"], ["rope", "rope+yarn", "rope+window"], ["alibi", "alibi+logn"]], name
        first = {line.get_label(): line.get_color() for line in axes[0].get_lines()}
        assert first["rope"] == figures.colour("rope") and first["alibi"] == figures.colour("alibi")
        rope = {line.get_label(): line.get_color() for line in axes[1].get_lines()}
        assert rope["rope"] == "#000000"  # as trained: black beside its methods
        assert rope["rope+yarn"] == figures.method_colour("yarn") != rope["rope+window"]
        assert axes[0].get_ylim() == axes[1].get_ylim() == axes[2].get_ylim()  # shared axes: panels compare
        assert (tmp_path / name).stat().st_size > 0
    assert not list(tmp_path.glob("*.svg"))  # one file per figure


def test_a_comparison_without_methods_keeps_one_panel_with_the_legend_beside_it(tmp_path, drawn):
    write_figures(figure_comparison(as_dict(drawn_variant("rope"), drawn_variant("alibi", shift=0.2)), tmp_path))
    (axis,) = drawn["plot.png"]
    assert axis.get_legend_handles_labels()[1] == ["rope", "alibi"]
    assert axis.get_legend().get_window_extent().x0 >= axis.get_window_extent().x1


def test_every_method_of_the_registry_has_its_own_colour_and_none_is_black():
    colours = [figures.method_colour(name) for name in list(METHODS)[1:]]
    assert len(set(colours)) == len(colours) and "#000000" not in colours
    assert figures.method_colour("none") == "#000000"
    assert figures.method_colour("yarn+logn") == figures.method_colour("yarn+logn") not in colours


def test_every_named_encoding_and_variant_has_a_colour_of_its_own():
    colours = [figures.colour(name) for name in figures.ENCODING_ORDER]
    assert len(set(colours)) == len(colours)
    assert len(figures.MARKERS) >= len(figures.ENCODING_ORDER)


# ----------------------------------------------------------------------------------------- use of the text

def test_the_positive_control_reads_as_many_tokens_as_the_longest_windows():
    # 32 windows of 1,025 tokens hold 32,800 tokens: 504 windows of 65
    assert fleet_windows(32, 64, 1024, 10**6) == {64: 504, 1024: 32}
    # as many as the held-out text holds, and never fewer than use_windows
    assert fleet_windows(32, 64, 1024, 65 * 100) == {64: 100, 1024: 32}
    assert fleet_windows(32, 64, 1024, 65 * 10) == {64: 32, 1024: 32}


def test_the_use_probe_that_cannot_fit_is_refused_with_the_count_that_fits():
    """At L = 256 the 16x windows are 4,097 tokens: 176,518 held-out tokens hold 43, fewer than 64 windows; the
    comparison says so before it trains (experiments.compare.prepare)."""
    with pytest.raises(Exception, match="holds 43: lower use_windows to 43"):
        check_fleet_windows(64, 256, 4096, 176_518)
    check_fleet_windows(64, 64, 1024, 176_518)  # 172 windows of 1,025 tokens: fits


def estimate(mean, low, high, n=3):
    return {"mean": mean, "low": low, "high": high, "n": n}


def use_comparison(summaries, trained=64, longest=1024, layers=4, margin=0.05):
    """What the use section reads of a Comparison."""
    return SimpleNamespace(use=summaries, trained=trained, longest=longest, layers=layers,
                           settings=SimpleNamespace(use_margin=margin))


def test_a_committed_use_table_is_read_again_under_the_calibrated_rule():
    """A migrated study's use table of three seeds (estimates only): a cell shown above 0 by its own interval (t =
    5.5 at 2 degrees of freedom) is 'cannot tell' in a family of 6 (Holm), how far back needs every nearer
    distance, and the window control's negative control counts only distances its layers cannot relay."""
    strong = estimate(2.0, 1.9, 2.1)
    columns = [(64, 32), (1024, 32), (1024, 128), (1024, 512)]

    def cells(*uses):
        return [{"length": n, "distance": d, "use": use} for (n, d), use in zip(columns, uses)]

    use = {"cells": {"rope": cells(estimate(0.190, 0.124, 0.257), strong, estimate(0.162, 0.035, 0.290), strong),
                     "rope+window": cells(estimate(0.190, 0.124, 0.257), strong, estimate(0.001, -0.010, 0.012),
                                          estimate(0.001, -0.004, 0.006))},
           "reach": {"rope+window": 64}}
    settings = SimpleNamespace(use_margin=0.05, use_distances=["0.5x", "2x", "8x"])
    found = committed_use(use, settings, lambda length: 2)  # three seeds: 2 degrees of freedom at every length
    verdicts = {(name, d, n): v for name, s in found.items() for d, n, v in zip(s.distances, s.lengths, s.verdicts)}
    assert verdicts[("rope", 32, 1024)] == "uses" and verdicts[("rope", 512, 1024)] == "uses"
    assert verdicts[("rope", 128, 1024)] == "cannot tell"  # p = 0.016 one-sided, above Holm's 0.025 / 3
    assert found["rope"].reads_back() == 32  # 512 reads "uses" but 128, nearer, does not
    assert use_margin([Spread(0.190, 0.033, 2)]) == pytest.approx(0.05)  # a tenth of +0.190 is below the floor
    assert verdicts[("rope+window", 128, 1024)] == verdicts[("rope+window", 512, 1024)] == "none"
    text = "\n".join(use_section(use_comparison(found)))
    assert "Holm-corrected" in text and "reads back to about 32 tokens" in text
    assert ("Negative control (rope+window, attention limited to 64 keys, which its 4 layers can relay about 252 "
            "tokens back): past that and a passage (16 tokens), d = 512 none (passes).") in text  # 4 x 63 + 16 < 512


def fleet_entry(rng, length, distances, use, presence=None, windows=8):
    """One method and length of a fleet_probe record: per window and distance, the mean over its passages (4 of
    them, each with noise of 0.05 nats)."""
    shape = (windows, len(distances))
    entry = {"method": "none", "length": length, "distances": distances, "reach": None,
             "use": (np.asarray(use)[None, :] + rng.normal(0, 0.025, shape)).tolist()}
    if presence is not None:
        entry["presence"] = (np.asarray(presence)[None, :] + rng.normal(0, 0.025, shape)).tolist()
    return entry


def test_the_priming_control_splits_a_variants_use_over_seeds_and_windows():
    rng = np.random.default_rng(0)
    # within L copying (all order); 2L back a use that is all presence: priming
    found = {"rope": [{"results": [fleet_entry(rng, 64, [32], [1.0], [0.0]),
                                   fleet_entry(rng, 256, [32, 128], [1.0, 0.3], [0.0, 0.3])]} for _ in range(3)]}
    summary = summarise_fleet(found, 0.05)["rope"]
    at = dict(zip(zip(summary.lengths, summary.distances), zip(summary.presence, summary.order)))
    presence, order = at[(256, 128)]
    assert presence.mean == pytest.approx(0.3, abs=0.03) and abs(order.mean) < 0.03
    presence, order = at[(256, 32)]
    assert abs(presence.mean) < 0.03 and order.mean == pytest.approx(1.0, abs=0.03)
    lines = use_section(use_comparison({"rope": summary}, longest=256))
    table = lines[lines.index("| variant | distance | use | presence | order |"):]
    assert len([line for line in table if line.startswith("| rope | 128 (2L) in 256 |")]) == 1
    # within L, the positive control (windows of L) and the same distance in the long windows: all order
    assert [line.split(" | ")[1] for line in table if line.startswith("| rope | 32 ")] == ["32 (0.5L) in 64",
                                                                                           "32 (0.5L) in 256"]


def test_use_against_the_tokens_trained_carries_the_order_within_l(monkeypatch, tmp_path):
    rng = np.random.default_rng(1)

    def found(order):  # within L a use of 1.0, of which `order` is reading in order
        return {"rope": [{"results": [fleet_entry(rng, 64, [32], [1.0], [1.0 - order]),
                                      fleet_entry(rng, 256, [32, 128], [1.0, 1.0], [1.0 - order, 1.0 - order])]}
                         for _ in range(3)]}

    by_step = {100: summarise_fleet(found(0.0), 0.05), 200: summarise_fleet(found(0.8), 0.05)}
    saved = {}
    monkeypatch.setattr(figures, "save", lambda figure, path, *a, **k: saved.setdefault("figure", figure))
    c = SimpleNamespace(use_by_step=by_step, trained=64, longest=256, tokens_per_step=2048, max_steps=200,
                        snapshots={"rope": [(1.0, Estimate(0.1, 0.0, 0.2, 3), None, None)]}, out=tmp_path)
    lines = budget_section(c)
    header = next(line for line in lines if line.startswith("| variant | tokens trained"))
    assert "order within L" in header
    rows = [line.split(" | ") for line in lines if line.startswith("| rope | ")]
    column = header.split(" | ").index("order within L")
    assert [float(row[column].split()[0]) for row in rows] == pytest.approx([0.0, 0.8], abs=0.05)
    assert [row[1] for row in rows] == ["204,800", "409,600"]  # steps x tokens per step
    assert rows[0][-1].strip(" |") == "n/a" and rows[1][-1].strip(" |") == "+0.100 [+0.000, +0.200]"  # the final one's
    # the figure: a panel of order within L beside use within L, its points the table's
    panels = {axis.get_title(): axis for axis in saved["figure"].axes}
    assert "order within L (L = 64)" in panels and "use within L (L = 64)" in panels
    [line] = panels["order within L (L = 64)"].get_lines()[:1]
    assert list(line.get_ydata()) == pytest.approx([0.0, 0.8], abs=0.05)


def test_the_max_column_is_shown_but_not_counted_in_how_far_back():
    rng = np.random.default_rng(2)
    found = {"rope": [{"results": [fleet_entry(rng, 64, [32], [1.0]), fleet_entry(rng, 256, [32, 128, 223],
                                                                                  [1.0, 1.0, 1.0])]}
                      for _ in range(3)]}
    assert summarise_fleet(found, 0.05)["rope"].reads_back() == 223  # every column reads "uses"
    summary = summarise_fleet(found, 0.05, pinned=True)["rope"]
    assert summary.pinned == 223 and summary.reads_back() == 128  # the window-start column is not a reach
    assert summary.at(223)[1] == "uses"  # still shown, with its verdict


# ------------------------------------------------------------------------------------------------ the map

def summary(verdicts, distances=(32, 128, 256, 512), lengths=(64, 1024, 1024, 1024), reach=None):
    """The first column in windows of L (the positive control), the others at the longest length."""
    return UseSummary("x", list(distances), [Estimate(0.5, 0.1, 0.9, 3)] * len(distances), list(verdicts), reach,
                      list(lengths))


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
    assert "reads back to about 256 tokens (4L; use there +0.500 nats)" in p.text.reads_back_words(64)
    assert "extrapolates: x" in "\n".join(map_findings([p]))


def text_variants() -> dict[str, Variant]:
    """rope, alibi, rope+yarn and rope+logn at L = 16, their penalties at 4x within noise of 0 (3 seeds)."""
    rng = np.random.default_rng(3)
    found = {}
    for encoding, method in (("rope", "none"), ("alibi", "none"), ("rope", "yarn"), ("rope", "logn")):
        v = Variant(encoding, method, label(encoding, method))
        v.nll = {n: {s: 4.0 + 0.01 * s for s in (1, 2, 3)} for n in (16, 64)}
        v.penalty = {64: {s: 0.002 + 0.05 * rng.standard_normal(8) for s in (1, 2, 3)}}
        found[v.label] = v
    return found


def map_comparison(out: Path, use=None) -> SimpleNamespace:
    """What the map reads of a Comparison at L = 16, longest 64."""
    return SimpleNamespace(variants=text_variants(), trained=16, longest=64, use=use or {}, task_records=[],
                           settings=SimpleNamespace(use_margin=0.05), out=out)


def test_the_map_reads_use_from_the_task_grids_and_harm_from_the_text(tmp_path, monkeypatch):
    grids = {"mqar": {  # the map's cell of each variant's grid (tasks.retrieval_grids): model, window, difference
        # rope beats its window control: the paired difference excludes 0
        "rope": (Estimate(0.9, 0.8, 1.0, 2), Estimate(0.06, 0.0, 0.12, 2), Estimate(0.84, 0.7, 0.98, 2)),
        # alibi does not: the interval of the difference holds 0
        "alibi": (Estimate(0.1, 0.0, 0.3, 2), Estimate(0.06, 0.0, 0.1, 2), Estimate(0.04, -0.1, 0.18, 2))}}
    monkeypatch.setattr(tasks, "retrieval_grids", lambda task_records: grids)
    c = map_comparison(tmp_path)
    points = {point.label: point for point in map_points(c)}
    rope, alibi = points["rope"], points["alibi"]
    assert rope.use["mqar"] == Estimate(0.9, 0.8, 1.0, 2) and rope.control["mqar"] == Estimate(0.06, 0.0, 0.12, 2)
    assert rope.harm == c.variants["rope"].penalty_estimate(64)
    # the text penalties here straddle 0 beyond the flat band
    assert rope.verdict == "extrapolates (text within noise)"
    assert alibi.verdict == "window-like (text within noise)"
    assert not points["rope+yarn"].use and points["rope+yarn"].verdict == "no use measured"  # no grid of its own
    text = "\n".join(map_findings(list(points.values())))
    assert "extrapolates (text within noise): rope" in text and "window-like (text within noise): alibi" in text
    section = "\n".join(map_section(c))
    assert "![the extrapolation map](map.png)" in section and (tmp_path / "map.png").stat().st_size > 0
    harm = cell(rope.harm, 3, signed=True)
    assert f"| rope | {harm} | n/a | 0.90 [0.80, 1.00] | 0.06 [0.00, 0.12] | +0.84 [+0.70, +0.98] | beats its " \
           "window | extrapolates (text within noise) |" in section


def test_the_map_section_draws_the_text_panel_from_the_use_probe(tmp_path):
    distances, lengths = (8, 32, 64, 60), (16, 64, 64, 64)
    use = {"rope": summary(["uses", "uses", "none", "none"], distances, lengths),
           "alibi": summary(["uses", "uses", "uses", "uses"], distances, lengths)}
    c = map_comparison(tmp_path, use)
    section = "\n".join(map_section(c))
    assert "![the extrapolation map](map.png)" in section and (tmp_path / "map.png").stat().st_size > 0
    assert "text use 4L back (nats)" in section and "reads back to about 64 tokens (4L; use there" in section
    harm = cell(c.variants["rope"].penalty_estimate(64), 3, signed=True)
    assert f"| rope | {harm}" in section and "reads back to about 32 tokens (2L; use there" in section
    assert "Lookup panels" not in section  # no lookup task in this comparison


# ------------------------------------------------------------------------------------------- the fixture

def trimmed(record: dict) -> dict:
    """A model record with each curve only a figure reads cut to CURVE_POINTS points."""
    for rows in record.get("probes", {}).get("attention", {}).values():
        for statistic in rows.values() if "error" not in rows else []:
            statistic["by_position"] = [values[:CURVE_POINTS] for values in statistic["by_position"]]
            statistic["positions"] = statistic["positions"][:CURVE_POINTS]
    for evaluation in [record.get("evaluation", {}), *record.get("snapshots", {}).values()]:
        curves = evaluation.get("curve", {})
        for method in curves:
            curves[method] = curves[method][:CURVE_POINTS]
    return record


def measure_fixture(folder: Path) -> None:
    """Run the fixture's micro comparison into `folder`, then write FIXTURE/study from it: its source named
    corpus.txt (in the settings and in every cell, each record stored under its cell's new key), records trimmed."""
    from data.sources import stdlib_files

    corpus = folder / "corpus.txt"
    names = {"textwrap.py", "string.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py", "colorsys.py",
             "keyword.py", "queue.py", "sched.py", "calendar.py"}  # tests/conftest.py small_text_file's
    corpus.write_text("\n<|endoftext|>\n".join(p.read_text() for p in stdlib_files() if p.name in names))
    run = folder / "run"
    assert main("experiments.compare", [*FIXTURE_SETTINGS, f"--compare.source={corpus}", "--out", str(run)]) == 0
    target = FIXTURE / "study"
    shutil.rmtree(target, ignore_errors=True)
    (target / "records").mkdir(parents=True)
    study = json.loads((run / "study.json").read_text())
    study["settings"].update(source="corpus.txt", out="runs/compare_report")
    study["cells"] = load_records(STUDY, run).cells
    for declared in study["cells"]:
        stored = json.loads((run / "records" / f"{key(declared)}.json").read_text())
        if "data" in declared:
            declared["data"]["source"] = "corpus.txt"
        stored.update(key=key(declared), cell=declared, record=trimmed(stored["record"]))
        (target / "records" / f"{key(declared)}.json").write_text(json.dumps(stored, separators=(",", ":")) + "\n")
    (target / "study.json").write_text(json.dumps(study, indent=1) + "\n")
    shutil.copy(run / "invocations.jsonl", target / "invocations.jsonl")


if __name__ == "__main__":  # rewrite the expected text (and with --records, the study folder first)
    with tempfile.TemporaryDirectory() as temporary:
        if "--records" in sys.argv:
            measure_fixture(Path(temporary))
        out = rendered(Path(temporary) / "render")
        shutil.copy(out / "report.md", FIXTURE / "report.md")
        shutil.copy(out / "table.md", FIXTURE / "table.md")
    sys.exit(0)
