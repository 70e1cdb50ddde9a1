"""experiments.ladder on the study engine: the shipped configs, a rung's settings and cells, the report's verdicts from
hand-made rung summaries (as a migrated record holds them), and (integration tier) a micro ladder end to end."""
import dataclasses
import json
import tomllib
from argparse import Namespace
from pathlib import Path

import pytest

from commands import results_json
from errors import ConfigError
from eval.stats import Estimate
from eval.verdicts import ordering_pairs, ordering_verdict
from experiments import compare, ladder
from experiments.engine import Context, key, load_records, main, resolve_settings
from tests.conftest import ROOT

CONFIG = ROOT / "configs" / "ladder.toml"
MICRO = {"compare.source": "", "compare.val_fraction": 0.3, "compare.vocab_size": 300, "compare.encodings": ["alibi", "rope"],
         "compare.methods": ["yarn"], "compare.snapshots": [0.5], "compare.snapshot_methods": ["yarn"],
         "compare.lengths": ["1x", "2x", "4x"], "compare.seeds": [1, 2], "compare.eval_tokens": 512,
         "compare.probes": [], "model.n_layers": 1, "model.max_seq_len": 16, "train.max_steps": 6,
         "train.batch_size": 4, "train.eval_interval": 3, "train.eval_batches": 1, "train.log_interval": 2}
RUNGS = {"d16": {"model.dim": 16, "model.n_heads": 1, "model.n_kv_heads": 1}, "d32": {"model.dim": 32}}


COMPARE = str(ROOT / "configs" / "compare.toml")


def shipped(path: Path) -> ladder.Settings:
    """A shipped ladder config's settings, its compare config found from any working directory."""
    settings = ladder.Settings(**tomllib.loads(path.read_text())["ladder"])
    assert settings.compare_config == "configs/compare.toml"
    return dataclasses.replace(settings, compare_config=COMPARE)


@pytest.mark.parametrize("path", [CONFIG, ROOT / "configs" / "ladder_gpu.toml"])
def test_every_shipped_rung_is_the_quick_preset_at_its_own_size(path):
    settings = shipped(path)
    quick = resolve_settings(compare.STUDY, Namespace(config=Path(COMPARE), preset="quick"), [])
    assert len(settings.rungs) == 3
    for rung, own in settings.rungs.items():
        found = ladder.rung_settings(settings, rung)
        assert found.model["dim"] == own["model.dim"] == int(rung[1:]) and found.model["dim"] // found.model["n_heads"] == 32
        assert found.encodings == ["none", "sinusoidal", "alibi", "rope"] and found.methods == ["yarn"]
        assert found.snapshots == [0.125, 0.25, 0.5] and found.snapshot_methods == ["yarn"]
        # only the size differs from the quick preset: the same data, L, budget and seeds
        assert found.train == quick.train and found.seeds == quick.seeds and found.source == quick.source
        assert found.model["max_seq_len"] == quick.model["max_seq_len"] and found.lengths == quick.lengths
        assert found.out == f"{settings.out}/{rung}"
    assert ladder.rung_settings(shipped(CONFIG), "d64").use_priming  # the CPU ladder probes use on every kept model


def test_a_setting_given_nested_on_the_command_line_counts_as_its_dotted_key_and_the_rung_wins():
    settings = ladder.Settings(COMPARE, rungs={"a": {"model.dim": 32, "compare.seeds": [7]}, "b": {"model.dim": 64}},
                               every_rung={"compare.seeds": [1, 2], "compare": {"encodings": ["rope"]},
                                           "train": {"lr": 0.01}})
    assert ladder.flat(settings.every_rung) == {"compare.seeds": [1, 2], "compare.encodings": ["rope"], "train.lr": 0.01}
    a, b = ladder.rung_settings(settings, "a"), ladder.rung_settings(settings, "b")
    assert (a.seeds, b.seeds, a.encodings, a.train["lr"], a.model["dim"], b.model["dim"]) == \
        ([7], [1, 2], ["rope"], 0.01, 32, 64)
    with pytest.raises(ConfigError, match="dims"):
        ladder.rung_settings(ladder.Settings(COMPARE, rungs={"a": {"compare.dims": 3}}), "a")


def test_rungs_that_would_need_two_data_sets_or_share_task_runs_are_refused_before_anything_is_prepared(tmp_path):
    settings = ladder.Settings(COMPARE, rungs={"a": {"compare.vocab_size": 300}, "b": {"compare.vocab_size": 400}},
                               out=str(tmp_path / "l"))
    with pytest.raises(ConfigError, match="share one data set"):
        ladder.prepare(settings, Context(tmp_path / "l"))
    tasks = ladder.Settings(COMPARE, rungs={"a": {"model.dim": 32}, "b": {"model.dim": 64}},  # one task folder
                            every_rung={"compare.tasks": ["copy"]}, out=str(tmp_path / "l"))
    with pytest.raises(ConfigError, match="no compare.tasks"):
        ladder.prepare(tasks, Context(tmp_path / "l"))
    assert not (tmp_path / "l" / "work").exists()


def test_the_cells_are_each_rungs_comparison_named_by_its_rung(small_text_file, tmp_path):
    settings = ladder.Settings(COMPARE, rungs=RUNGS, every_rung={**MICRO, "compare.source": str(small_text_file)},
                               out=str(tmp_path / "l"))
    context = Context(tmp_path / "l")
    ladder.prepare(settings, context)
    found = {cell["name"]: cell for cell in ladder.cells(settings, context)}
    assert sorted(found) == sorted(f"{r}/{e}-seed{s}" for r in RUNGS for e in ("alibi", "rope") for s in (1, 2))
    assert {found[f"{r}/rope-seed1"]["run"]["model"]["dim"] for r in RUNGS} == {16, 32}
    assert found["d16/rope-seed1"]["data"] == found["d32/rope-seed1"]["data"]  # one data set for every rung
    assert len({key(cell) for cell in found.values()}) == len(found)


def estimate(mean, half):
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": 3}


def write_ladder(out: Path, rungs: dict[str, list], multiple: float = 16.0) -> None:
    """A ladder folder of hand-made rung summaries (as a migrated record holds them): rows of (label, fraction,
    (penalty mean, half width)) at 400 steps of 1,000 tokens (the second rung 4,000), 1x perplexity 100 +- 5."""
    cells = []
    (out / "records").mkdir(parents=True)
    for index, (rung, rows) in enumerate(rungs.items()):
        points: dict[str, list] = {}
        for label, fraction, penalty in rows:
            points.setdefault(label, []).append([fraction, round(fraction * 400) * 1000 * (1 + 3 * index),
                                                 estimate(*penalty), estimate(100.0, 5.0)])
        cell = {"name": f"{rung}/aggregate", "kind": "migrated"}
        summary = {"longest_multiple": multiple, "parameters": {"rope": 1000 * (index + 1)}, "points": points,
                   "setup": {"source": "stdlib", "encodings": ["rope"], "methods": ["yarn"], "seeds": [1, 2, 3],
                             "snapshot_methods": ["yarn"], "trained": 64, "model": {"n_layers": 4}, "train": {}}}
        (out / "records" / f"{key(cell)}.json").write_text(results_json(
            {"key": key(cell), "cell": cell, "record": {"summary": summary}, "seconds": 60.0, "machine": "m"}))
        cells.append(cell)
    settings = {"compare_config": COMPARE, "rungs": {rung: {"model.dim": 64 * (i + 1)} for i, rung in enumerate(rungs)}, "out": str(out)}
    (out / "study.json").write_text(json.dumps({"study": "experiments.ladder", "settings": settings, "cells": cells}))
    (out / "invocations.jsonl").write_text(json.dumps({"command": "python -m experiments.ladder", "machine": "m",
                                                       "where": "here", "wall_s": 60.0}) + "\n")


def test_the_report_says_how_each_penalty_moves_and_whether_the_orders_agree(tmp_path):
    # small: rope's penalty grows with training (0.10 -> 0.40, separated), alibi's stays flat, sinusoidal's shrinks;
    # large: rope's stays within noise. At the full budget small orders alibi < rope < sinusoidal; large orders
    # rope < alibi (reversed) and rope ≈ sinusoidal.
    write_ladder(tmp_path / "l", {
        "small": [("rope", 0.125, (0.10, 0.02)), ("rope", 0.5, (0.25, 0.05)), ("rope", 1.0, (0.40, 0.05)),
                  ("alibi", 0.125, (0.01, 0.01)), ("alibi", 1.0, (0.005, 0.01)),
                  ("sinusoidal", 0.125, (0.90, 0.05)), ("sinusoidal", 1.0, (0.60, 0.05))],
        "large": [("rope", 0.125, (0.10, 0.05)), ("rope", 1.0, (0.12, 0.05)), ("alibi", 0.125, (0.30, 0.02)),
                  ("alibi", 1.0, (0.30, 0.02)), ("sinusoidal", 0.125, (0.20, 0.05)), ("sinusoidal", 1.0, (0.15, 0.2))]})
    ladder.report(load_records(ladder.STUDY, tmp_path / "l"))
    text = (tmp_path / "l" / "report.md").read_text()
    assert "  - rope: with training grows (small), within noise (large); with size shrinks (+0.400 -> +0.120 nats" in text
    assert "  - alibi: with training within noise at every rung; with size grows" in text
    assert "  - sinusoidal: with training shrinks (small), within noise (large)" in text
    assert "Between the smallest and the largest rung: differs: a pair separated at both rungs" in text
    assert "  - reversed: rope > alibi at small, rope < alibi at large" in text
    assert "  - separated at small only: rope < sinusoidal; alibi < sinusoidal" in text
    assert "| small | model.dim = 64 | 1,000 | 400,000 | 1.0 min |" in text  # 400 steps of 1,000 tokens
    assert "| rope | large | +0.100 [+0.050, +0.150] (0.2M) | n/a | +0.120 [+0.070, +0.170] (1.6M) |" in text
    # every 1x perplexity here is the same, so a method would repeat its model: none is a method here
    assert "Not repeated" not in text and (tmp_path / "l" / "penalty.png").stat().st_size > 0


def test_a_method_leaves_the_1x_table_only_where_it_repeats_its_model(tmp_path):
    write_ladder(tmp_path / "l", {"r": [("rope", 1.0, (0.4, 0.05)), ("rope+yarn", 1.0, (0.2, 0.05)),
                                        ("alibi", 1.0, (0.0, 0.01)), ("alibi+logn", 1.0, (0.0, 0.01))]})
    path = next((tmp_path / "l" / "records").iterdir())
    stored = json.loads(path.read_text())
    stored["record"]["summary"]["points"]["alibi+logn"][0][3] = estimate(101.0, 5.0)  # a method that changes 1x
    path.write_text(json.dumps(stored))
    ladder.report(load_records(ladder.STUDY, tmp_path / "l"))
    table = (tmp_path / "l" / "table.md").read_text()
    penalty, ppl = table.split("### Perplexity at 1x")
    assert "| rope+yarn | r |" in penalty and "| rope+yarn |" not in ppl and "| alibi+logn | r | 101.00" in ppl
    assert "with size n/a (+0.400 -> +0.400 nats, r -> r)" in (tmp_path / "l" / "report.md").read_text()  # one rung
    assert "Not repeated: rope+yarn (at 1x the same numbers as the model without the method)" in ppl


def test_a_ladder_of_rungs_evaluated_at_different_lengths_is_refused(tmp_path):
    write_ladder(tmp_path / "l", {"a": [("rope", 1.0, (0.1, 0.01))]})
    write_ladder(tmp_path / "m", {"b": [("rope", 1.0, (0.1, 0.01))]}, multiple=8.0)
    study = json.loads((tmp_path / "l" / "study.json").read_text())
    other = json.loads((tmp_path / "m" / "study.json").read_text())
    for path in (tmp_path / "m" / "records").iterdir():
        path.rename(tmp_path / "l" / "records" / path.name)
    study["cells"] += other["cells"]
    study["settings"]["rungs"]["b"] = {"model.dim": 128}
    (tmp_path / "l" / "study.json").write_text(json.dumps(study))
    with pytest.raises(ConfigError, match="different longest lengths"):
        ladder.report(load_records(ladder.STUDY, tmp_path / "l"))


def test_two_orders_agree_only_where_both_separate_a_pair():
    e = lambda mean: Estimate(mean, mean - 0.01, mean + 0.01, 3)  # noqa: E731
    kinds = ordering_pairs(["a", "b", "c"], {"a": e(0.1), "b": e(0.5), "c": e(0.5)},
                           {"a": e(0.2), "b": e(0.6), "c": None}, ("s", "l"))
    assert kinds["same"] == ["a < b"] and not kinds["reversed"] and kinds["neither"] == []  # c: no estimate at l
    assert ordering_verdict(kinds).startswith("the same")
    assert ordering_verdict(ordering_pairs(["a", "b"], {"a": e(0.1), "b": e(0.105)}, {"a": e(0.3), "b": e(0.1)},
                                           ("s", "l"))).startswith("no pair reverses")


@pytest.mark.integration  # a micro ladder: 2 rungs x 2 encodings x 2 seeds, ~40 s
def test_micro_ladder_end_to_end(small_text_file, tmp_path):
    config = tmp_path / "ladder.toml"
    every = {**MICRO, "compare.source": str(small_text_file)}
    config.write_text(f"[ladder]\ncompare_config = {json.dumps(COMPARE)}\n[ladder.rungs]\n" + "".join(
        f"{rung} = {{ {', '.join(f'{json.dumps(k)} = {json.dumps(v)}' for k, v in own.items())} }}\n"
        for rung, own in RUNGS.items()) + "[ladder.every_rung]\n" + "".join(
        f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in every.items()))
    out = tmp_path / "ladder"
    args = ["--config", str(config), "--out", str(out), "--workers", "1", "--threads", "1"]
    assert main("experiments.ladder", args) == 0
    report = (out / "report.md").read_text()
    for text in ("# Scale ladder", "Reproduce: `python -m experiments.ladder", "| d16 | model.dim = 16",
                 "With training", "Order of the variants", "![penalty against training tokens",
                 "| rope+yarn | d32 |", "0.5 of training"):
        assert text in report, text
    for name in ("penalty.png", "ppl.png", "table.md", "d16/report.md", "d32/report.md", "d32/penalty.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "d16" / "report.md").read_text().startswith("# Position-encoding extrapolation (d16")
    records = load_records(ladder.STUDY, out)
    trained = next(cell for cell, _ in records.done() if cell["name"] == "d32/rope-seed2")
    assert (compare.run_folder(out / "work", trained) / "snapshots" / "step-000003").is_dir()
    assert len(records.done()) == 8 and not records.missing()
    # a rerun measures nothing; --report-only renders the same report from the records
    assert main("experiments.ladder", args) == 0
    assert len(records.invocations) + 1 == len(load_records(ladder.STUDY, out).invocations)
    assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["measured"] == 0
    before = (out / "table.md").read_text()
    assert main("experiments.ladder", ["--report-only", "--out", str(out)]) == 0
    assert (out / "table.md").read_text() == before
