"""The budget search: at what training budget does a text model copy in order within L, as a real model does?

    python -m experiments.budget_search --comparisons runs/budget/a,runs/budget/b --encoding rope --out runs/search

A cell is a model that an experiments.compare study folder (one configuration) kept (work/runs/ENCODING-seedS/
snapshots/step-N, and the finished run), known by its weights' SHA-256, measured with eval/use.py's probe and priming
control at the same settings for every model: use, presence and order within L, and where each configuration's curve
short of the target points (eval/verdicts.py projection).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from data.batches import read_meta
from data.tokenizer import ENDOFTEXT, load_tokenizer
from errors import ConfigError
from eval.heldout import checkpoint_eval_tokens
from eval.stats import t_interval
from eval.use import DEFAULT_MARGIN, FLEET_NGRAM, PER_DISTANCE, default_span, measure_checkpoint
from eval.verdicts import projection
from experiments import compare
from experiments.engine import Records, Study, load_records, option
from experiments.render import bars, cell, estimate_of, finish, panels, write
from model.checkpoint import WEIGHTS, load_model, trained_length, training_data_dir
from model.runtime import resolve_device


@dataclass
class Settings:
    comparisons: list = option([], "experiments.compare study folders, one configuration each")
    encoding: str = option("rope", "the encoding whose kept models are measured")
    windows: int = option(256, "windows of L per model (the intervals are over windows: at least 3 for one)")
    distance: int = option(0, "tokens between the copies for every L (0: L/2)")
    span: int = option(0, "passage tokens for every L (0: L/4, 8 to 64)")
    target: float = option(1.0, "order within L to reach, nats")
    out: str = option("runs/budget_search", "the study's folder")


def kept_models(run: Path) -> list[Path]:
    """A run's snapshots and, once its training finished, the run itself (before that it is a resume point)."""
    state = json.loads((run / "trainer_state.json").read_text()) if (run / "trainer_state.json").exists() else {}
    done = bool(state) and state["step"] == state["run_config"]["train"]["max_steps"]
    return sorted((run / "snapshots").glob("step-*")) + ([run] if done else [])


def weights(path: Path) -> str:
    return hashlib.sha256((path / WEIGHTS).read_bytes()).hexdigest()[:16]


def cells(settings: Settings, context) -> list[dict]:
    """Every kept model of the encoding's runs in each comparison, as the comparison's own cells name them."""
    found = []
    for folder in map(Path, settings.comparisons):
        declared = load_records(compare.STUDY, folder).cells if (folder / "study.json").exists() else []
        runs = [(c["seed"], compare.run_folder(folder / "work", c)) for c in declared
                if c.get("encoding") == settings.encoding and c["kind"] == "model"]
        kept = [(seed, run, path) for seed, run in runs if run.exists() for path in kept_models(run)]
        if not kept:
            raise ConfigError(f"{folder}: no model of {settings.encoding} kept in its runs: give experiments.compare "
                              "study folders with compare.snapshots (--encoding names one)")
        found += [{"name": f"{folder.name}/{settings.encoding}-seed{seed}/{path.name if path != run else 'final'}",
                   "configuration": folder.name, "encoding": settings.encoding, "seed": seed,
                   "step": json.loads((path / "trainer_state.json").read_text())["step"], "weights": weights(path),
                   "windows": settings.windows, "distance": settings.distance, "span": settings.span,
                   "local": {"checkpoint": str(path)}} for seed, run, path in kept]
    return found


def measure(cell: dict, context) -> dict:
    """eval.use's probe at L with the priming control and its defaults (its row: use, presence and order per window,
    the verdict), what the trainer state says of the model's training, and the configuration its run trained."""
    path = Path(cell["local"]["checkpoint"])
    if weights(path) != cell["weights"]:
        raise ConfigError(f"{path} holds other weights than the cell was declared on: run the study again")
    trained, tokenizer, data = trained_length(path), load_tokenizer(path), training_data_dir(path)
    span = cell["span"] or default_span(trained)
    found, _ = measure_checkpoint(load_model(path, resolve_device(context.device)).eval(), checkpoint_eval_tokens(
        data, path, tokenizer)[0], trained, [trained], [str(cell["distance"] or "0.5x")], span, PER_DISTANCE,
        cell["windows"], 0, [], None, FLEET_NGRAM, tokenizer.convert_tokens_to_ids(ENDOFTEXT), priming=True)
    if not found:
        raise ConfigError(f"{path}: a passage of {span} tokens {cell['distance'] or 'L/2'} back does not fit in L")
    state, meta = json.loads((path / "trainer_state.json").read_text()), read_meta(data)
    model, train = state["run_config"]["model"], state["run_config"]["train"]
    return {"probe": {"span": span, **found[0].row(0, trained, DEFAULT_MARGIN)},
            "training": {"tokens": state["tokens_seen"], "elapsed_s": state["elapsed_s"], "val_loss": state["val_loss"]},
            "configuration": {"source": Path(str(meta.get("source", "?"))).name, "train_tokens": meta.get("train_tokens"),
                              "dim": model["dim"], "layers": model["n_layers"], "L": model["max_seq_len"],
                              "batch": train["batch_size"], "lr": train["lr"], "steps": train["max_steps"]}}


def report(records: Records) -> None:
    settings, target, groups = records.settings, records.settings.target, {}
    for one, record in records.done():  # a row per configuration and step: its seeds' models
        groups.setdefault(one["configuration"], {}).setdefault(one["step"], []).append(record)
    configs = {name: next(iter(steps.values()))[0]["configuration"] for name, steps in groups.items()}
    estimate = lambda at, key: estimate_of(at[0]["probe"][key]) if len(at) == 1 else t_interval(  # noqa: E731
        [model["probe"][key]["mean"] for model in at])  # one seed: over its windows; several: over their means
    where = ("a passage of L/4 tokens (8 to 64) L/2 back" if not settings.distance else
             f"a passage of {settings.span or 'L/4'} tokens {settings.distance} tokens back")
    lines = ["# The budget search: use and order within L against tokens trained", "",
             f"Reproduce: `{records.invocations[-1]['command']}` (on {records.invocations[-1]['machine']}). Each model "
             f"the comparisons kept is measured with `python -m eval.use --lengths 1x --distances "
             f"{settings.distance or '0.5x'}" + (f" --span {settings.span}" if settings.span else "")
             + f" --windows {settings.windows} --priming` on its run's held-out text: use = "
             f"NLL(control) - NLL(probe) on {where}, repeated in windows of L; presence = what the passage's tokens in "
             "context give (the first copy shuffled); order = use - presence, what reading it in order adds. Target: "
             f"order within L of at least {target:+.1f} nats (SmolLM2 copies by +2 to +3, all order). Intervals: 95% t"
             " over windows for one seed, over the seeds' means for several. Passes: tokens trained over the training "
             "data's tokens (a pass beyond 1 repeats the data).", "", "| configuration | data (training tokens) | d x "
             "layers | L | batch | lr | steps |", "|---|---|---|---:|---:|---:|---:|"] + [
        f"| {name} | {c['source']} ({format(c['train_tokens'], ',') if c['train_tokens'] else '?'}) | {c['dim']} x "
        f"{c['layers']} | {c['L']} | {c['batch']} | {c['lr']:g} | {c['steps']:,} |" for name, c in configs.items()] + [
        "", "| configuration | step | tokens trained | passes | training wall (min) | val loss | use within L | "
        "presence | order | verdict |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, steps in groups.items():
        for step, at in sorted(steps.items()):
            tokens, size = at[0]["training"]["tokens"], configs[name]["train_tokens"]
            lines.append(f"| {name} | {step:,} | {tokens:,} | {f'{tokens / size:.1f}' if size else '?'} | "
                         f"{max(r['training']['elapsed_s'] for r in at) / 60:.0f} | "
                         f"{sum(r['training']['val_loss'] for r in at) / len(at):.3f} | " + " | ".join(
                             cell(estimate(at, k), 3, True) for k in ("use", "presence", "order")) + " | "
                         + ", ".join(sorted({r["probe"].get("verdict", "?") for r in at})) + " |")
    lines += ["", "![use and order within L against tokens trained](budget.png)", "", "Where each configuration's "
              "order points (an extrapolation from its last two kept models, not a measurement):", ""]
    for name in configs:
        points = [(at[0]["training"]["tokens"], e) for _, at in sorted(groups[name].items()) if (e := estimate(at, "order"))]
        reached = [tokens for tokens, e in points if e.mean >= target]
        lines.append(f"- {name}: " + (f"order's mean over windows passes {target:+.1f} at {reached[0]:,} tokens "
                                       "(one trained model: not a claim about another training run)" if reached
                                       else projection(points, target)))
    write(records.out, "report.md", "\n".join(lines) + "\n")
    figure, axes = panels(2)
    for axis, key in zip(axes, ("use", "order")):
        bars(axis, [(f"{name} (L {c['L']}, d {c['dim']})", {"marker": "o", "color": f"C{index}"}, [
            (at[0]["training"]["tokens"] / 1e6, estimate(at, key)) for _, at in sorted(groups[name].items())])
            for index, (name, c) in enumerate(configs.items())])
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xscale("log")
        axis.grid(True, alpha=0.3)
    axes[1].axhline(target, color="grey", linestyle="--", linewidth=0.8)
    finish(figure, axes, ["use within L", "order within L"], records.out / "budget.png", "training tokens (millions)",
           "nats, 95% t", "The budget search: copying a repeated passage within L against tokens trained")


STUDY = Study("experiments.budget_search", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.budget_search"))
