"""The budget search: at what training budget does a text model copy in order within L, as a real model does?

    python -m experiments.budget_search --runs runs/budget/a runs/budget/b --encoding rope --out runs/budget/search

Each run is a comparison's out folder (python -m experiments.compare ... --compare.snapshots=[...]) that trained one
configuration (data, shape, L, batch); the search reads every model it kept (OUT/runs/ENCODING/seedN/snapshots/
step-N and the finished model, not a half-trained resume point) and measures each with eval.use's probe and its
priming control on the run's own held-out text, at the same settings for every model: use within L (a repeated
passage of L/4 tokens L/2 back in windows of L; --distance and --span fix both in tokens for every L), presence
(what the passage's tokens in context give, shuffled) and order (what reading them in order adds: use - presence). A real model's copying is order (SmolLM2: docs/results.md); a tiny
model's within-L use can be all presence, so the target (--target, +1.0 nats) is judged on order.

One table (every configuration and kept model, with tokens trained, passes over the training data and the training
wall time to it), one figure (use and order within L against tokens trained, a line per configuration) and, for a
configuration that has not reached the target, where its curve points: the tokens at which order would reach it if
the growth of its last doubling went on (geometric, the optimistic reading) and if its gain per doubling went on
(linear in log tokens, the pessimistic one). Both are extrapolations, said so in the report. Intervals: over windows
for one seed, over the seeds' means for several. Cells are cached per model (OUT/cells): a re-run measures only what
a longer training has added.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from commands import parse, portable_command, require
from errors import ConfigError, cli_command
from eval import figures
from eval import use as use_probe
from eval.stats import Estimate, t_interval
from experiments.compare import cells
from experiments.jobs import machine_description


@dataclass(frozen=True)
class Kept:
    """One model a run kept: its seed, step, folder and training record."""
    seed: int
    step: int
    path: Path
    tokens: int
    elapsed_s: float
    val_loss: float


def kept_models(run: Path, encoding: str) -> list[Kept]:
    """Every snapshot and finished model of `encoding` in the comparison folder `run`."""
    seeds = sorted((run / "runs" / encoding).glob("seed*"))
    if not seeds:
        raise ConfigError(f"{run}: no runs/{encoding}/seed* folder: pass a comparison's out folder that trained "
                          f"{encoding!r} (--encoding names it)")
    found = []
    for seed_dir in seeds:
        seed = int(seed_dir.name.removeprefix("seed"))
        folders = sorted((seed_dir / "snapshots").glob("step-*"))
        record = seed_dir / "trainer_state.json"
        state = json.loads(record.read_text()) if record.exists() else {}
        if state and state.get("step") == state["run_config"]["train"]["max_steps"]:
            folders.append(seed_dir)  # finished: the seed folder is the last model, not a resume point
        for folder in folders:
            record = json.loads((folder / "trainer_state.json").read_text())
            found.append(Kept(seed, record["step"], folder, record["tokens_seen"], record["elapsed_s"],
                              record["val_loss"]))
    return found


def describe(run: Path, kept: Kept) -> dict:
    """The configuration a run trained: data, shape, L, batch, learning rate and the training data's size."""
    config = json.loads((kept.path / "trainer_state.json").read_text())["run_config"]
    model, train = config["model"], config["train"]
    meta_path = run / "data" / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    source = str(meta.get("source", "?"))
    return {"run": run.name, "source": Path(source).name if "/" in source else source,
            "train_tokens": meta.get("train_tokens"), "dim": model["dim"], "layers": model["n_layers"],
            "L": model["max_seq_len"], "batch": train["batch_size"], "lr": train["lr"], "steps": train["max_steps"]}


def probe_options(windows: int, distance: int | None, span: int | None) -> list[str]:
    """eval.use's options for every kept model: windows of L, one distance (L/2 or `distance` tokens)."""
    return ["--lengths", "1x", "--distances", str(distance or "0.5x"), *(["--span", str(span)] if span else []),
            "--windows", str(windows), "--priming"]


def measure(kept: Kept, out: Path, options: list[str]) -> dict:
    """eval.use at L with the priming control on one kept model, cached in `out` (its results.json row)."""
    if not (out / "results.json").exists() and use_probe.main(
            ["--checkpoint", str(kept.path), *options, "--out", str(out)]) != 0:
        raise ConfigError(f"eval.use could not measure {kept.path} (its error above)")
    record = next(iter(json.loads((out / "results.json").read_text()).values()))
    return record["rows"][0]


def estimate(values: list[dict]) -> Estimate | None:
    """One seed: its interval over windows; several: the t interval over the seeds' means."""
    if len(values) == 1:
        v = values[0]
        return Estimate(v["mean"], v.get("low"), v.get("high"), v["n"])
    return t_interval([v["mean"] for v in values])


def tokens_text(tokens: float) -> str:
    return "beyond 1e15 tokens" if tokens > 1e15 else f"{tokens:.2g} tokens"


def projection(points: list[tuple[int, Estimate]], target: float) -> str:
    """Where order's curve points from its last two kept models: the tokens at which it would reach `target` if
    its last doubling's growth went on (geometric) and if its gain per doubling went on (linear in log tokens).
    Only from points whose order is shown above 0 (interval above 0) and growing: noise has no direction."""
    if len(points) < 2:
        return "one kept model: no projection"
    (t1, e1), (t2, e2) = points[-2], points[-1]
    o1, o2, doublings = e1.mean, e2.mean, math.log2(t2 / t1)
    shown = [e.has_interval and e.low > 0 for e in (e1, e2)]
    if not shown[1]:
        return f"order at the last kept model {cell(e2)}, not shown above 0: no projection"
    if o2 <= o1:
        return f"order did not grow over its last {doublings:.0f} doubling(s) ({o1:+.3f} -> {o2:+.3f}): no projection"
    gain = (o2 - o1) / doublings
    text = f"gain {gain:+.3f} nats per doubling, linear in log tokens: {tokens_text(t2 * 2 ** ((target - o2) / gain))}"
    if shown[0]:
        growth = (o2 / o1) ** (1 / doublings)
        geometric = t2 * 2 ** (math.log(target / o2) / math.log(growth))
        text = f"x{growth:.2f} per doubling, geometric: {tokens_text(geometric)}; " + text
    return f"from {t1:,} to {t2:,} tokens, " + text


def cell(e: Estimate | None) -> str:
    return cells.cell(e, 3, signed=True)


def report(configs: list[dict], rows: list[dict], target: float, command: str, options: list[str]) -> str:
    where = ("a passage of L/4 tokens (8 to 64) L/2 back" if "0.5x" in options else
             f"a passage of {options[options.index('--span') + 1] if '--span' in options else 'L/4'} tokens "
             f"{options[options.index('--distances') + 1]} tokens back")
    lines = ["# The budget search: use and order within L against tokens trained", "",
             f"Reproduce: `{command}` (on {machine_description()}). Each model the comparisons kept is measured with "
             f"`python -m eval.use {' '.join(options)}` on its run's held-out "
             f"text: use = NLL(control) - NLL(probe) on {where}, repeated in windows of L; presence = what "
             "the passage's tokens in context give (the first copy shuffled); order = use - presence, what reading it "
             f"in order adds. Target: order within L of at least {target:+.1f} nats (SmolLM2 copies by +2 to +3, all "
             "order). Intervals: 95% t over windows for one seed, over the seeds' means for several. Passes: tokens "
             "trained over the training data's tokens (a pass beyond 1 repeats the data).", "",
             "| configuration | data (training tokens) | d x layers | L | batch | lr | steps |", "|---|---|---|---:|---:|---:|---:|"]
    for c in configs:
        size = f"{c['train_tokens']:,}" if c["train_tokens"] else "?"
        lines.append(f"| {c['run']} | {c['source']} ({size}) | {c['dim']} x {c['layers']} | {c['L']} | {c['batch']} | "
                     f"{c['lr']:g} | {c['steps']:,} |")
    lines += ["", "| configuration | step | tokens trained | passes | training wall (min) | val loss | use within L | "
              "presence | order | verdict |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['step']:,} | {r['tokens']:,} | {r['passes']} | {r['minutes']:.0f} | "
                     f"{r['val_loss']:.3f} | {cell(r['use'])} | {cell(r['presence'])} | {cell(r['order'])} | "
                     f"{r['verdict']} |")
    lines += ["", "![use and order within L against tokens trained](budget.png)", "",
              "Where each configuration's order points (an extrapolation from its last two kept models, not a "
              "measurement):", ""]
    for c in configs:
        points = [(r["tokens"], r["order"]) for r in rows if r["run"] == c["run"] and r["order"]]
        reached = [t for t, o in points if o.mean >= target]
        lines.append(f"- {c['run']}: " + (f"order reaches {target:+.1f} at {reached[0]:,} tokens" if reached
                                           else projection(points, target)))
    return "\n".join(lines) + "\n"


def plot(configs: list[dict], rows: list[dict], target: float, path: Path) -> Path:
    figure, axes = figures.new(2, width=11, height=4.2)
    for key, axis, title in (("use", axes[0], "use within L"), ("order", axes[1], "order within L")):
        for index, c in enumerate(configs):
            mine = [r for r in rows if r["run"] == c["run"] and r[key] is not None]
            xs = [r["tokens"] / 1e6 for r in mine]
            means = [r[key].mean for r in mine]
            below = [r[key].mean - (r[key].low if r[key].has_interval else r[key].mean) for r in mine]
            above = [(r[key].high if r[key].has_interval else r[key].mean) - r[key].mean for r in mine]
            axis.errorbar(xs, means, yerr=[below, above], marker="o", markersize=4, capsize=3, linewidth=1.2,
                          color=f"C{index}", label=f"{c['run']} (L {c['L']}, d {c['dim']})")
        axis.axhline(0, color="black", linewidth=0.8)
        if key == "order":
            axis.axhline(target, color="grey", linestyle="--", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_xlabel("training tokens (millions)")
        axis.set_title(title, fontsize=10)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("nats, 95% t")
    figure.suptitle("The budget search: copying a repeated passage within L against tokens trained")
    return figures.save(figure, path, axes[0], below=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.budget_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", type=Path, help="comparison out folders, one configuration each")
    parser.add_argument("--encoding", default="rope", help="the encoding whose kept models are measured")
    parser.add_argument("--windows", type=int, default=256, help="eval.use windows per model")
    parser.add_argument("--target", type=float, default=1.0, help="order within L to reach, nats")
    parser.add_argument("--distance", type=int, help="tokens between the copies for every L (default: L/2)")
    parser.add_argument("--span", type=int, help="passage tokens for every L (default: L/4, 8 to 64)")
    parser.add_argument("--out", type=Path, required=True)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, argv, "out")
    require(parser, args, "runs")
    if args.windows < 3:
        raise ConfigError("--windows must be at least 3: the intervals are over windows")
    options = probe_options(args.windows, args.distance, args.span)
    configs, rows = [], []
    for run in args.runs:
        kept = kept_models(run, args.encoding)
        if not kept:
            raise ConfigError(f"{run}: no kept model yet: set --compare.snapshots and let training pass the first")
        configs.append(describe(run, kept[0]))
        for step in sorted({k.step for k in kept}):
            at = [k for k in kept if k.step == step]
            found = [measure(k, args.out / "cells" / run.name / f"seed{k.seed}-step{k.step}", options)
                     for k in at]
            train_tokens = configs[-1]["train_tokens"]
            rows.append({"run": run.name, "step": step, "tokens": at[0].tokens,
                         "passes": f"{at[0].tokens / train_tokens:.1f}" if train_tokens else "?",
                         "minutes": max(k.elapsed_s for k in at) / 60,
                         "val_loss": sum(k.val_loss for k in at) / len(at),
                         "use": estimate([f["use"] for f in found]),
                         "presence": estimate([f["presence"] for f in found]),
                         "order": estimate([f["order"] for f in found]),
                         "verdict": ", ".join(sorted({f.get("verdict", "?") for f in found}))})
    args.out.mkdir(parents=True, exist_ok=True)
    command = portable_command("python -m experiments.budget_search --runs " + " ".join(str(r) for r in args.runs)
                               + f" --encoding {args.encoding} --windows {args.windows}"
                               + (f" --distance {args.distance}" if args.distance else "")
                               + (f" --span {args.span}" if args.span else "") + f" --out {args.out}")
    (args.out / "report.md").write_text(report(configs, rows, args.target, command, options))
    plot(configs, rows, args.target, args.out / "budget.png")
    (args.out / "results.json").write_text(json.dumps(
        {"configurations": configs, "target": args.target,
         "rows": [{**r, **{k: cells.estimate_dict(r[k]) for k in ("use", "presence", "order")}}
                  for r in rows]}, indent=1))
    print(f"wrote {args.out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
