"""experiments.budget_search on the study engine: which models of a comparison's study folder it reads, where it says
a curve points (eval/verdicts.py projection), one cell measured on a micro model, and (integration tier) the study end
to end."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from errors import ConfigError
from eval.stats import Estimate
from eval.verdicts import projection
from experiments import budget_search, compare
from experiments.engine import Context, load_records, main


def shown(mean: float) -> Estimate:
    return Estimate(mean, mean - 0.01, mean + 0.01, 256)


def test_projection_doubles_and_adds_per_doubling():
    # order doubles over one doubling of tokens (0.125 -> 0.25 from 1M to 2M): geometric, two more doublings to
    # +1.0 (8M tokens); a gain of 0.125 per doubling, six more (128M)
    text = projection([(1_000_000, shown(0.125)), (2_000_000, shown(0.25))], 1.0)
    assert "x2.00 per doubling, geometric: 8e+06 tokens" in text
    assert "linear in log tokens: 1.3e+08 tokens" in text


def test_projection_refuses_noise_and_decline():
    noise = Estimate(0.002, -0.003, 0.007, 256)
    assert "not shown above 0" in projection([(1_000_000, shown(0.1)), (2_000_000, noise)], 1.0)
    assert "did not grow" in projection([(1_000_000, shown(0.2)), (2_000_000, shown(0.1))], 1.0)
    # the earlier point within noise: the linear reading only
    text = projection([(1_000_000, noise), (2_000_000, shown(0.1))], 1.0)
    assert "geometric" not in text and "linear in log tokens" in text


def set_step(folder: Path, step: int, max_steps: int) -> None:
    path = folder / "trainer_state.json"
    state = json.loads(path.read_text())
    state["step"], state["tokens_seen"] = step, step * 64
    state["run_config"]["train"]["max_steps"] = max_steps
    path.write_text(json.dumps(state))


def comparison(prepared_data: Path, root: Path) -> Path:
    """A comparison's study folder around one micro run: work/runs/rope-seed1 with a snapshot at step 1."""
    from train.pretrain import main as pretrain

    cell = {"name": "rope-seed1", "kind": "model", "encoding": "rope", "seed": 1, "data": {"digest": "micro"},
            "run": {"model": {"dim": 32}, "train": {"max_steps": 2}}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "study.json").write_text(json.dumps({"study": "experiments.compare", "cells": [cell], "settings":
                                                 dataclasses.asdict(compare.Settings(encodings=["rope"], out=str(root)))}))
    run = compare.run_folder(root / "work", cell)  # where the comparison trained the cell
    assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={run}", "--model.vocab_size=512", "--model.dim=32",
                     "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=32",
                     "--train.max_steps=2", "--train.batch_size=2", "--train.eval_batches=1"]) == 0
    snapshot = run / "snapshots" / "step-000001"
    shutil.copytree(run, snapshot, ignore=shutil.ignore_patterns("snapshots"))
    set_step(snapshot, 1, 2)
    weights = load_file(snapshot / "model.safetensors")  # a model of its own, as an earlier one would be
    save_file({name: tensor * 0.5 for name, tensor in weights.items()}, snapshot / "model.safetensors")
    return root


def comparison_copy(folder: Path, tmp_path: Path) -> Path:
    shutil.copytree(folder, tmp_path / "copy" / folder.name)
    return tmp_path / "copy" / folder.name


@pytest.fixture(scope="module")
def study_folder(prepared_data, tmp_path_factory) -> Path:
    return comparison(prepared_data, tmp_path_factory.mktemp("budget") / "cmp")


def test_the_cells_are_the_snapshots_and_the_finished_model_not_a_resume_point(study_folder, tmp_path):
    settings = budget_search.Settings(comparisons=[str(study_folder)], windows=4, distance=12, span=6)
    found = budget_search.cells(settings, Context(tmp_path))
    assert [(c["name"], c["step"], c["seed"]) for c in found] == [("cmp/rope-seed1/step-000001", 1, 1),
                                                                  ("cmp/rope-seed1/final", 2, 1)]
    assert found[0]["weights"] != found[1]["weights"] and len(found[0]["weights"]) == 16
    assert {(c["windows"], c["distance"], c["span"]) for c in found} == {(4, 12, 6)}
    assert "local" in found[0] and found[0]["local"]["checkpoint"].endswith("step-000001")
    unfinished = comparison_copy(study_folder, tmp_path)
    set_step(next((unfinished / "work" / "runs").glob("rope-seed1-*")), 2, 4)  # the run folder is now a resume point
    assert [c["step"] for c in budget_search.cells(
        budget_search.Settings(comparisons=[str(unfinished)]), Context(tmp_path))] == [1]
    with pytest.raises(ConfigError, match="no model of alibi kept"):
        budget_search.cells(budget_search.Settings(comparisons=[str(study_folder)], encoding="alibi"), Context(tmp_path))


def test_a_cell_splits_use_into_presence_and_order_on_its_own_weights(study_folder, tmp_path):
    settings = budget_search.Settings(comparisons=[str(study_folder)], windows=4, distance=12, span=6)
    cell = budget_search.cells(settings, Context(tmp_path))[1]
    record = budget_search.measure(cell, Context(tmp_path))
    probe = record["probe"]
    assert probe["span"] == 6 and probe["distance"] == 12 and probe["length"] == 32 and probe["n"] == 4
    use, presence = (np.asarray(probe[f"{k}_values"]) for k in ("use", "presence"))
    assert abs(float(np.mean(use - presence)) - probe["order"]["mean"]) < 1e-6 and len(use) == 4  # order: use - presence
    assert record["training"]["tokens"] == json.loads((next((study_folder / "work" / "runs").glob("rope-seed1-*")) /
                                                       "trainer_state.json").read_text())["tokens_seen"]
    assert {k: record["configuration"][k] for k in ("dim", "layers", "L", "batch", "steps")} == \
        {"dim": 32, "layers": 1, "L": 32, "batch": 2, "steps": 2}
    other = comparison_copy(study_folder, tmp_path)  # other weights at the path the cell names
    shutil.copy(next((other / "work" / "runs").glob("rope-seed1-*")) / "snapshots" / "step-000001" / "model.safetensors",
                next((other / "work" / "runs").glob("rope-seed1-*")) / "model.safetensors")
    with pytest.raises(ConfigError, match="other weights"):
        budget_search.measure({**cell, "local": {"checkpoint": str(next((other / "work" / "runs").glob("rope-seed1-*")))}},
                              Context(tmp_path))


@pytest.mark.integration  # two kept models measured through the engine, ~10 s
def test_the_search_end_to_end(study_folder, tmp_path):
    out = tmp_path / "search"
    args = ["--comparisons", str(study_folder), "--windows", "4", "--out", str(out), "--workers", "1",
            "--threads", "1"]
    assert main("experiments.budget_search", args) == 0
    report = (out / "report.md").read_text()
    assert "| cmp | 2 | 128 |" in report and "| cmp | 1 | 64 |" in report  # step, tokens (set_step: 64 a step)
    assert "`python -m eval.use --lengths 1x --distances 0.5x --windows 4 --priming`" in report
    assert "- cmp: " in report and (out / "budget.png").stat().st_size > 0
    records = load_records(budget_search.STUDY, out)
    assert [record["probe"]["distance"] for _, record in records.done()] == [16, 16]  # L/2 of L = 32
    fixed = tmp_path / "fixed"  # a fixed probe for every L: the cells and the report say so
    assert main("experiments.budget_search", [*args[:-6], "--out", str(fixed), "--distance", "12", "--span", "6",
                                              "--workers", "1", "--threads", "1"]) == 0
    assert "a passage of 6 tokens 12 tokens back" in (fixed / "report.md").read_text()
    assert {record["probe"]["span"] for _, record in load_records(budget_search.STUDY, fixed).done()} == {6}
