"""The transfer table (experiments/use_transfer.py): one use grid's ranking of methods beside another model's."""
from pathlib import Path

import numpy as np
import pytest

from eval.use import summarise_grid
from experiments.engine import load_records
from experiments.use_grid import STUDY
from experiments.use_grid_report import load, name, shown
from experiments.use_transfer import multiples_past, per_window, section

ROOT = Path(__file__).resolve().parents[1]


def grid(trained: int, distances: list[int], uses: dict[str, float], seed: int, windows: int = 8) -> dict:
    """One text of a use grid as use_grid_report.load gives it: plain RoPE 2 nats within L and 3 past it, every other
    method 2.5 past it; use at every distance the method's planted mean, with a spread of 0.1 over windows."""
    rng = np.random.default_rng(seed)
    methods = {m: [{"within": 2.0, "past": 3.0 if m == "none" else 2.5 + rng.normal(0, 0.01),
                    **{d: {"use": mean + rng.normal(0, 0.1)} for d in distances}} for _ in range(windows)]
               for m, mean in uses.items()}
    return {"text": {"trained": trained, "length": 2 * trained, "distances": distances, "methods": methods}}


def reaches(texts: dict) -> dict:
    return {"texts": {t: {"trained": g["trained"], "methods": {m: {"reach": None} for m in g["methods"]}}
                      for t, g in texts.items()}}


def pair_words(lines: list[str]) -> dict[str, str]:
    """'A - B / quantity' -> what the two models say of the pair, from the pairs table."""
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| ") and " - " in line.split(" | ")[0]]
    return {f"{row[0]} / {row[1]}": row[-1] for row in rows if row[0] != "A - B"}


def test_a_planted_reversal_is_named_and_the_order_kept_elsewhere():
    first = grid(16, [20], {"none": 0.0, "yarn": 1.0, "sinks": 0.2, "selfextend": 2.0}, seed=0)
    second = grid(32, [40, 56], {"none": 0.0, "yarn": 0.2, "sinks": 1.0, "selfextend": 2.0}, seed=1)
    assert multiples_past(first) & multiples_past(second) == {1.25}  # 20 of 16 and 40 of 32; 56 / 32 only the second
    assert per_window(first, 1.25)["yarn"][("text", 0)]["penalty"] == pytest.approx(0.5, abs=0.05)
    lines = section([first, second], [reaches(first), reaches(second)], ("a", "b"), "folder", shown, name)
    text = "\n".join(lines)
    rows = pair_words(lines)
    assert rows["YaRN - sinks + window / use 1.25L back"] == "reversed"
    assert rows["plain RoPE - SelfExtend / use 1.25L back"] == "the same order"
    assert rows["YaRN - SelfExtend / penalty past L"] == "separated in neither"  # the same 2.5 nats in both
    # ranks 1-4 by use: selfextend, yarn, sinks, none against selfextend, sinks, yarn, none: 1 - 6 x 2 / 60 = 0.8
    # every draw keeps both orders (means 0.2 to 1 apart, windows' noise 0.1): the estimate and that count, no interval
    assert ("Spearman's rank correlation of the two models' use 1.25L back, 4 methods, over the windows every "
            "method has (a 8, b 8): +0.80 in 2,000 of 2,000 "
            "bootstrap draws over windows (at least 95% of them: the windows' noise leaves it there, no interval to "
            "show)") in text
    assert "penalty past L, 4 methods, over the windows every method has (a 8, b 8): +1.00 [+0." in text  # the three at 2.5 nats reorder: an interval
    assert "| YaRN | " in text and "| 2 / 3 |" in text
    few = grid(32, [40], {"none": 0.0, "yarn": 0.2, "sinks": 1.0}, seed=2, windows=2)  # 2 windows: no noise measured
    lines = section([first, few], [reaches(first), reaches(few)], ("a", "b"), "folder", shown, name)
    assert "- Spearman's rank correlation of the use 1.25L back: not computed, fewer than 3 windows" in "\n".join(lines)
    # a pair the 2-window model cannot test is not "separated in a only", though a separates it
    few_rows = pair_words(lines)
    assert rows["plain RoPE - SelfExtend / use 1.25L back"] == "the same order"
    assert few_rows["plain RoPE - YaRN / use 1.25L back"] == "not tested in b (fewer than 3 windows)"
    assert not any(word.startswith("separated in") for word in few_rows.values())
    # 4 windows, 2 in each text: pairs are tested, the correlation's bootstrap within a text is not drawn
    two_texts = {"a": few["text"], "b": grid(32, [40], {"none": 0.0, "yarn": 0.2, "sinks": 1.0}, seed=5, windows=2)["text"]}
    lines = section([first, two_texts], [reaches(first), reaches(two_texts)], ("a", "b"), "folder", shown, name)
    assert "use 1.25L back: not computed, fewer than 3 windows that every method has in a text" in "\n".join(lines)


def test_a_grid_beside_itself_agrees_everywhere():
    folder = ROOT / "results" / "real_model_grid"
    texts = load(load_records(STUDY, folder))
    summary = summarise_grid(texts)
    lines = section([texts, texts], [summary, summary], ("smollm2", "smollm2"), str(folder), shown, name)
    words = set(pair_words(lines).values())
    assert words <= {"the same order", "separated in neither"} and "the same order" in words
    text = "\n".join(lines)  # each model's windows are resampled on their own: the interval is not a point
    assert "use 1.75L back, 11 methods, over the windows every method has (smollm2 16, smollm2 16): +1.00 [+0." in text and "p < 5e-06 by permutation" in text


def test_beside_a_folder_with_no_study_is_refused_before_any_cell(tmp_path):
    from errors import ConfigError
    from experiments.engine import Context
    from experiments.use_grid import Settings, cells

    settings = Settings(checkpoint="runs/any", texts=["any.txt"], beside=str(tmp_path))
    with pytest.raises(ConfigError, match="--beside .*: no study there"):
        cells(settings, Context(tmp_path, 1))


def test_a_method_on_every_layer_is_paired_with_its_default_layers_by_window():
    from experiments.use_transfer import layers_lines

    texts = grid(16, [20], {"none": 0.0, "linear": 1.5, "linear@all": 1.0, "yarn": 2.0}, seed=3, windows=6)
    for window in texts["text"]["methods"]["linear@all"]:
        window["past"] += 0.3  # planted: on every layer, harmed 0.3 nats more past L
    rows = {row[0] + " / " + row[1]: row[2:] for row in (line.strip("| ").split(" | ") for line in
                                                          layers_lines(texts, shown, name) if line.startswith("| PI"))}
    use, penalty = rows["PI (linear) / use 1.25L back"], rows["PI (linear) / penalty past L"]
    assert float(use[0].split()[0]) == pytest.approx(-0.5, abs=0.1) and use[0].endswith("separated")  # 1.0 less 1.5
    assert float(penalty[0].split()[0]) == pytest.approx(0.3, abs=0.02) and penalty[0].endswith("separated")
    assert use[1] == penalty[1] == "6"
    assert len(rows) == 2  # yarn has no @all twin: not paired
    assert layers_lines(grid(16, [20], {"none": 0.0, "yarn": 2.0}, seed=4), shown, name) == []


def test_the_correlation_is_read_on_the_windows_every_method_has():
    """A window that one method alone has (a grid still running) moves that method's mean in the table, not the
    correlation, whose bootstrap resamples only the windows every method has: its estimate is read there too."""
    first = grid(16, [20], {"none": 0.0, "yarn": 1.0, "sinks": 0.2, "selfextend": 2.0}, seed=0)
    second = grid(32, [40], {"none": 0.0, "yarn": 0.2, "sinks": 1.0, "selfextend": 2.0}, seed=1)
    base = "\n".join(section([first, second], [reaches(first), reaches(second)], ("a", "b"), "f", shown, name))
    # plain RoPE's ninth window reads 30 nats: its mean (3.3) would rank it first, and the correlation -0.40
    first["text"]["methods"]["none"].append({**first["text"]["methods"]["none"][0], 20: {"use": 30.0}})
    lines = section([first, second], [reaches(first), reaches(second)], ("a", "b"), "f", shown, name)
    spearman_lines = [line for line in lines if "Spearman" in line]
    assert spearman_lines == [line for line in base.split("\n") if "Spearman" in line]
    assert "(a 8, b 8): +0.80" in spearman_lines[0]
    assert "| plain RoPE | +3.3" in "\n".join(lines)  # the table's mean takes every window
