"""The budget search (experiments/budget_search.py): which models of a comparison it reads, where it says a curve
points, and that its cells split use into presence and order."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from eval.stats import Estimate
from experiments.budget_search import kept_models, main, projection


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
    """A comparison's layout around one micro run: runs/rope/seed1 with a snapshot at step 1."""
    from train.pretrain import main as pretrain

    seed = root / "runs" / "rope" / "seed1"
    assert pretrain([f"--data.dir={prepared_data}", f"--out.dir={seed}", "--model.vocab_size=512", "--model.dim=32",
                     "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=32",
                     "--train.max_steps=2", "--train.batch_size=2", "--train.eval_batches=1"]) == 0
    snapshot = seed / "snapshots" / "step-000001"
    shutil.copytree(seed, snapshot, ignore=shutil.ignore_patterns("snapshots"))
    set_step(snapshot, 1, 2)
    return root


def test_reads_snapshots_and_the_finished_model_not_a_resume_point(prepared_data, tmp_path):
    run = comparison(prepared_data, tmp_path / "cmp")
    assert [k.step for k in kept_models(run, "rope")] == [1, 2]
    set_step(run / "runs" / "rope" / "seed1", 2, 4)  # training not finished: the folder is a resume point
    assert [k.step for k in kept_models(run, "rope")] == [1]


def test_cells_split_use_into_presence_and_order(prepared_data, tmp_path):
    run = comparison(prepared_data, tmp_path / "cmp")
    out = tmp_path / "search"
    assert main(["--runs", str(run), "--windows", "4", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert abs(r["use"]["mean"] - r["presence"]["mean"] - r["order"]["mean"]) < 1e-5
    assert "| cmp | 2 |" in (out / "report.md").read_text() and (out / "budget.png").stat().st_size > 0
    # a fixed probe for every L: the cells say so
    fixed = tmp_path / "fixed"
    assert main(["--runs", str(run), "--windows", "4", "--distance", "12", "--span", "6", "--out", str(fixed)]) == 0
    [cell] = json.loads((fixed / "cells" / "cmp" / "seed1-step2" / "results.json").read_text()).values()
    assert cell["span"] == 6 and [r["distance"] for r in cell["rows"]] == [12]
    assert "a passage of 6 tokens 12 tokens back" in (fixed / "report.md").read_text()
