"""experiments.ladder: the config, a micro ladder end to end, and the aggregation against hand-made results files."""
import json
import os

import pytest

from errors import ConfigError
from experiments.compare.config import load_compare_config
from experiments.ladder import (
    collect_ladder,
    findings,
    ladder_table,
    load_ladder_config,
    main,
    ordering_comparison,
    size_trend,
    training_trends,
)
from tests.conftest import ROOT
from tests.test_compare import MICRO


def test_the_shipped_ladder_loads_every_rung_from_the_quick_preset():
    config = load_ladder_config(ROOT / "configs" / "ladder.toml")
    assert list(config.rungs) == ["d64", "d128", "d256"]
    quick, quick_shared, _ = load_compare_config(ROOT / "configs" / "compare.toml", "quick", [])
    for name, dim in (("d64", 64), ("d128", 128), ("d256", 256)):
        compare, shared, preset = load_compare_config(config.compare_config, config.preset,
                                                      config.rung_overrides(name))
        assert preset == "quick" and shared["model"]["dim"] == dim and shared["model"]["dim"] // \
            shared["model"]["n_heads"] == 32
        assert compare.encodings == ["none", "sinusoidal", "alibi", "rope"] and compare.methods == ["yarn"]
        assert compare.snapshots == [0.125, 0.25, 0.5] and compare.snapshot_methods == ["yarn"]
        # Only the size differs from the quick preset: the same data, L, budget and seeds.
        assert shared["train"] == quick_shared["train"] and compare.seeds == quick.seeds
        assert shared["model"]["max_seq_len"] == quick_shared["model"]["max_seq_len"]
        assert compare.source == quick.source and compare.lengths == quick.lengths


def write_config(tmp_path, text):
    path = tmp_path / "ladder.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, message", [
    ("[ladder]\nrungs = [{ name = 'a', 'model.dim' = 32 }]\n", "at least two rungs"),
    ("[ladder]\nsize = 3\n", "unknown keys ['size']"),
    ("[ladder]\nrungs = [{ 'model.dim' = 32 }, { name = 'b' }]\n", "inline table with a name"),
    ("[ladder]\nrungs = [{ name = 'a', dim = 32 }, { name = 'b' }]\n", "section.key"),
    ("[ladder]\nrungs = [{ name = 'a' }, { name = 'a' }]\n", "two rungs are named 'a'"),
    ("[nothing]\n", "no [ladder] table"),
])
def test_bad_ladder_configs_name_the_problem(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_ladder_config(write_config(tmp_path, text))


def test_rungs_option_keeps_the_named_rungs_and_refuses_unknown_ones():
    config = load_ladder_config(ROOT / "configs" / "ladder.toml", ["d256", "d64"])
    assert list(config.rungs) == ["d64", "d256"]  # the config's order
    with pytest.raises(ConfigError, match="d32"):
        load_ladder_config(ROOT / "configs" / "ladder.toml", ["d32"])


def test_micro_ladder_end_to_end(small_text_file, tmp_path):
    config = write_config(tmp_path, f"""
[ladder]
compare_config = "{ROOT / 'configs' / 'compare.toml'}"
preset = "quick"
rungs = [{{ name = "d16", "model.dim" = 16, "model.n_heads" = 1 }}, {{ name = "d32", "model.dim" = 32 }}]
[ladder.every_rung]
"compare.encodings" = ["alibi", "rope"]
"compare.methods" = ["yarn"]
"compare.snapshots" = [0.5]
"compare.snapshot_methods" = ["yarn"]
""")
    out = tmp_path / "ladder"
    overrides = [o for o in MICRO if not o.startswith(("--compare.methods", "--compare.seeds", "--model.dim"))]
    args = ["--config", str(config), "--out", str(out), f"--compare.source={small_text_file}",
            "--compare.val_fraction=0.3", "--compare.seeds=1,2", "--compare.workers=1", *overrides]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    points = {(p["rung"], p["label"], p["fraction"]): p for p in results["points"]}
    # 6 steps of 4 x 16 tokens: the model kept at half of training saw 192 tokens, the final one 384.
    assert set(points) == {(r, v, f) for r in ("d16", "d32") for v in ("alibi", "rope", "rope+yarn")
                           for f in (0.5, 1.0)}
    assert {p["tokens"] for p in points.values() if p["fraction"] == 0.5} == {192}
    assert all(p["penalty"]["low"] <= p["penalty"]["mean"] <= p["penalty"]["high"] for p in points.values())
    assert results["rungs"]["d16"]["parameters"]["rope"] < results["rungs"]["d32"]["parameters"]["rope"]
    assert os.path.islink(out / "d16" / "data") and (out / "data" / "meta.json").exists()  # one data set
    report = (out / "report.md").read_text()
    for text in ("# Scale ladder", "Reproduce: `python -m experiments.ladder", "| d16 |", "With training",
                 "Order of the variants", "![penalty against training tokens"):
        assert text in report, text
    for name in ("penalty.png", "ppl.png", "table.md", "d16/report.md", "d32/report.md"):
        assert (out / name).stat().st_size > 0
    # A re-run trains nothing; --report-only rebuilds the same numbers.
    assert main([*args, "--report-only"]) == 0
    assert json.loads((out / "results.json").read_text())["points"] == results["points"]


def estimate(mean, half):
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": 3}


def write_rung(folder, rows, tokens_per_step=1000, max_steps=400):
    """A hand-made results.json as experiments.compare writes it: snapshot rows (label, fraction, penalty, ppl_1x)."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "settings": {"tokens_per_step": tokens_per_step, "max_steps": max_steps, "trained_length": 64,
                     "lengths": [64, 1024], "wall_s": 60.0, "parameters": {"rope": 1000}, "compare": {},
                     "shared": {}},
        "snapshots": [{"label": label, "fraction": fraction, "penalty": estimate(*penalty),
                       "ppl_1x": estimate(100.0, 5.0), "ppl_longest": None}
                      for label, fraction, penalty in rows]}))


def test_aggregation_against_hand_made_results(tmp_path):
    # small: rope's penalty grows with training (0.10 -> 0.40, separated), alibi's stays flat, sinusoidal's
    # shrinks; large: rope's stays within noise of its first value. At the full budget, small orders
    # alibi < rope < sinusoidal; large orders rope < alibi (reversed) and rope ≈ sinusoidal.
    write_rung(tmp_path / "small", [
        ("rope", 0.125, (0.10, 0.02)), ("rope", 0.5, (0.25, 0.05)), ("rope", 1.0, (0.40, 0.05)),
        ("alibi", 0.125, (0.01, 0.01)), ("alibi", 1.0, (0.005, 0.01)),
        ("sinusoidal", 0.125, (0.90, 0.05)), ("sinusoidal", 1.0, (0.60, 0.05))])
    write_rung(tmp_path / "large", [
        ("rope", 0.125, (0.10, 0.05)), ("rope", 1.0, (0.12, 0.05)),
        ("alibi", 0.125, (0.30, 0.02)), ("alibi", 1.0, (0.30, 0.02)),
        ("sinusoidal", 0.125, (0.20, 0.05)), ("sinusoidal", 1.0, (0.15, 0.2))], tokens_per_step=4000)
    ladder = collect_ladder(tmp_path, ["small", "missing", "large"])
    assert ladder.rungs == ["small", "large"] and ladder.longest_multiple == 16
    rope_small = {p.fraction: p.tokens for p in ladder.series("small", "rope")}
    assert rope_small == {0.125: 50 * 1000, 0.5: 200 * 1000, 1.0: 400 * 1000}  # step = fraction x 400
    assert ladder.final("large", "rope").tokens == 400 * 4000
    assert training_trends(ladder, "rope") == {"small": "grows", "large": "within noise"}
    assert training_trends(ladder, "alibi") == {"small": "within noise", "large": "within noise"}
    assert training_trends(ladder, "sinusoidal") == {"small": "shrinks", "large": "within noise"}
    assert size_trend(ladder, "rope") == "shrinks" and size_trend(ladder, "alibi") == "grows"
    kinds = ordering_comparison(ladder)
    assert kinds["reversed"] == ["rope > alibi at small, rope < alibi at large"]
    assert kinds["only_small"] == ["rope < sinusoidal", "alibi < sinusoidal"] and not kinds["only_large"]
    text = "\n".join(findings(ladder))
    assert "rope: with training grows (small), within noise (large); with size shrinks" in text
    assert "differs" in text and "alibi: with training within noise at every rung" in text
    # every hand-made row has the same 1x perplexity, so a method variant would repeat its base: none here
    assert ladder.distinct_at_1x() == ["rope", "alibi", "sinusoidal"]


def test_a_method_is_left_out_of_the_1x_measure_only_where_it_repeats_its_model(tmp_path):
    write_rung(tmp_path / "r", [("rope", 1.0, (0.4, 0.05)), ("rope+yarn", 1.0, (0.2, 0.05)),
                                ("alibi", 1.0, (0.0, 0.01)), ("alibi+logn", 1.0, (0.0, 0.01))])
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    results["snapshots"][3]["ppl_1x"] = estimate(101.0, 5.0)  # a method that changes 1x
    (tmp_path / "r" / "results.json").write_text(json.dumps(results))
    ladder = collect_ladder(tmp_path, ["r"])
    assert ladder.distinct_at_1x() == ["rope", "alibi", "alibi+logn"]
    assert "rope+yarn" in "\n".join(ladder_table(ladder, "penalty"))
    assert "rope+yarn" not in "\n".join(ladder_table(ladder, "ppl"))


def test_ladder_refuses_rungs_evaluated_at_different_lengths(tmp_path):
    write_rung(tmp_path / "a", [("rope", 1.0, (0.1, 0.01))])
    write_rung(tmp_path / "b", [("rope", 1.0, (0.1, 0.01))])
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    results["settings"]["lengths"] = [64, 512]
    (tmp_path / "b" / "results.json").write_text(json.dumps(results))
    with pytest.raises(ConfigError, match="different longest lengths"):
        collect_ladder(tmp_path, ["a", "b"])
