"""The comparison's optional sections beyond perplexity: probes of each trained model (attention diagnostics, the
induction probe, passkey retrieval) and the synthetic task suite trained per encoding.

    [compare]
    probes = ["attention", "induction", "passkey"]   # run on every variant and seed after its evaluation
    probe_lengths = ["1x", "4x"]                      # lengths (attention, passkey) and copy distances (induction)
    tasks = ["copy", "associative_recall", "flipflop"]   # experiments.tasks, trained per encoding and seed

Probe results are cached per model in OUT/probes/ENCODING/seedS-PROBE.json (recomputed when the weights or the
settings change); task results go to OUT/tasks/TASK/. The report gets one section per probe and per task, with
intervals over seeds, and findings that set the attention statistics beside the extrapolation penalty.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from data.tasks import TASKS
from data.tokenizer import ENDOFTEXT, load_tokenizer
from errors import ConfigError, PositionRangeError
from eval import figures
from eval.attention_diagnostics import BINS, STATISTICS, attention_statistics, curve, summarise
from eval.extrapolation import resolve_length
from eval.figures import colour
from eval.induction import induction_probe, ordinary_token_ids
from eval.passkey import evaluate_passkey
from eval.stats import Estimate, seeds_and_trials, t_interval
from eval.use import default_span
from experiments.compare.cells import cell, header
from experiments.compare.config import CompareConfig
from experiments.compare.layout import probe_path, task_path, weights_digest
from experiments.compare.results import ComparisonResults
from experiments.compare.use import (
    PER_DISTANCE,
    UseSummary,
    budget_section,
    probe_use,
    probe_windows,
    summarise_use,
    use_section,
)
from experiments.tasks import (
    CONTROL,
    DEFAULT_LENGTH,
    DEFAULT_MODEL,
    DEFAULT_TRAIN,
    Suite,
    grid_table,
    rate_caption,
    rate_cell,
    run_suite,
    steps_cell,
    task_train,
    write_suite,
)
from model.transformer import Transformer

PASSKEY_DEPTHS = [0.0, 0.5, 1.0]
INDUCTION_BLOCK, INDUCTION_TRIALS = 32, 32
TASK_LENGTH, TASK_MULTIPLES = DEFAULT_LENGTH, [1, 2, 4, 8]


def _per_length(compare: CompareConfig, trained: int, run: Callable[[int], Any]) -> dict[str, Any]:
    """run(length) for every probe length; a length the model cannot run (a learned table's end) is recorded as an
    error, not raised."""
    rows: dict[str, Any] = {}
    for item in compare.probe_lengths:
        try:
            rows[item] = run(resolve_length(item, trained))
        except (ConfigError, PositionRangeError) as error:
            rows[item] = {"error": str(error)}
    return rows


def _attention(model: Transformer, checkpoint: Path, ids: np.ndarray, trained: int, compare: CompareConfig) -> dict:
    return _per_length(compare, trained, lambda length: summarise(
        attention_statistics(model, ids, length, compare.probe_tokens), trained))


def induction_block(trained: int) -> int:
    return max(2, min(INDUCTION_BLOCK, trained // 4))


def _induction(model: Transformer, checkpoint: Path, ids: np.ndarray, trained: int, compare: CompareConfig) -> dict:
    """At each probe length, the second copy ends the sequence: distance = length - block."""
    ordinary = ordinary_token_ids(load_tokenizer(checkpoint), model.config.vocab_size)
    block = induction_block(trained)
    return _per_length(compare, trained, lambda length: induction_probe(
        model, ordinary, [length - block], block, INDUCTION_TRIALS, seed=0)[0])


def _passkey(model: Transformer, checkpoint: Path, ids: np.ndarray, trained: int, compare: CompareConfig) -> dict:
    tokenizer = load_tokenizer(checkpoint)
    return _per_length(compare, trained, lambda length: evaluate_passkey(
        model, tokenizer, [length], PASSKEY_DEPTHS, compare.passkey_trials, seed=0))


def _use(model: Transformer, checkpoint: Path, ids: np.ndarray, trained: int, compare: CompareConfig) -> dict:
    return probe_use(model, ids, trained, compare, load_tokenizer(checkpoint).convert_tokens_to_ids(ENDOFTEXT))


# name -> the probe; the names are experiments/compare/config.py's PROBE_NAMES (tests/test_compare_package.py checks).
PROBES: dict[str, Callable[..., dict]] = {"attention": _attention, "induction": _induction, "passkey": _passkey,
                                          "use": _use}


def run_probes(model: Transformer, checkpoint: Path, ids: np.ndarray, trained: int, compare: CompareConfig,
               encoding: str, seed: int, step: int | None = None) -> list[str]:
    """Run compare.probes on one trained model (compare.snapshot_probes on its snapshot at `step`), each unless
    cached for the same weights and settings."""
    notes, digest = [], weights_digest(checkpoint)
    for probe in compare.probes if step is None else compare.snapshot_probes:
        path = probe_path(compare.out, encoding, seed, probe, step)
        key = {"weights": digest, "lengths": compare.probe_lengths, "tokens": compare.probe_tokens,
               "trials": compare.passkey_trials}
        if probe == "use":
            key = {"weights": digest, "lengths": compare.lengths, "distances": compare.use_distances,
                   "windows": [list(item) for item in sorted(probe_windows(compare, trained, len(ids)).items())], "methods": compare.methods, "span": default_span(trained),
                   "per_distance": PER_DISTANCE, **({"priming": True} if compare.use_priming else {})}
        if path.exists():
            try:
                if json.loads(path.read_text()).get("key") == key:
                    notes.append(f"{probe} cached")
                    continue
            except (OSError, ValueError):
                pass  # unreadable: recomputed
        print(f"--- probe {probe} ---", flush=True)
        rows = PROBES[probe](model, checkpoint, ids, trained, compare)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_suffix(".tmp")
        staging.write_text(json.dumps({"key": key, "rows": rows}) + "\n")
        staging.replace(path)
        notes.append(f"{probe} done")
    return notes


def cached_subset(saved: dict, settings: dict) -> dict | None:
    """A task's saved results for `settings`: all of them when saved with the same settings, or those of the
    encodings wanted when saved for more encodings with otherwise the same settings (each encoding's models are
    trained alone, so they do not depend on the others); None otherwise."""
    if not saved:
        return None
    if saved.get("settings") == settings:
        return saved
    wanted, had = settings["encodings"], saved.get("settings", {}).get("encodings", {})
    same_rest = {k: v for k, v in saved.get("settings", {}).items() if k != "encodings"} == \
        {k: v for k, v in settings.items() if k != "encodings"}
    if not same_rest or any(had.get(name) != model for name, model in wanted.items()):
        return None
    return {**saved, "settings": settings,
            "results": {e: v for e, v in saved["results"].items() if e in wanted},
            "training": {e: v for e, v in saved.get("training", {}).items() if e in wanted},
            **({"grid": {label_: v for label_, v in saved["grid"].items() if label_.split("+")[0] in wanted}}
               if "grid" in saved else {})}


def run_tasks(compare: CompareConfig, out: Path, shared_model: dict) -> None:
    """The task suite for every encoding of the comparison (its variants' model settings, and the position_args of
    the comparison's [model] that reach it), seeds shared with it, in compare.workers processes; a task whose
    results exist for the same settings (or for more encodings, otherwise the same) is not trained again."""
    encodings = {name: compare.model_settings(name, shared_model) for name in compare.encodings}
    train = task_train({"max_steps": compare.task_steps, **({"lr_cycle": compare.task_cycle} if compare.task_cycle
                                                            else {})})
    methods = [m for m in compare.methods if CONTROL not in m.split("+")]  # the window control is always scored
    settings = {"encodings": encodings, "seeds": compare.seeds, "length": TASK_LENGTH, "model": DEFAULT_MODEL,
                "train": train, "until": compare.task_until or None}
    if any(TASKS[name].make_at is not None for name in compare.tasks):
        settings["methods"] = methods
    if compare.task_count != 256:  # the default is left out, so that earlier results stay cached
        settings["count"] = compare.task_count
    suite = Suite()
    for name in compare.tasks:
        path = task_path(out, name)
        saved = cached_subset(json.loads(path.read_text()) if path.exists() else {}, settings)
        if saved:
            print(f"task {name}: cached")
            suite.results[name], suite.training[name] = saved["results"], saved.get("training", {})
            if "grid" in saved:
                suite.grids[name] = saved["grid"]
    todo = [name for name in compare.tasks if name not in suite.results]
    if todo:
        print(f"tasks {', '.join(todo)}: training {len(encodings)} encodings x {len(compare.seeds)} seeds", flush=True)
        suite.update(run_suite(todo, encodings, compare.seeds, TASK_LENGTH, TASK_MULTIPLES, compare.task_count,
                               {"model": DEFAULT_MODEL, "train": train}, out / "tasks" / "runs", compare.workers,
                               compare.task_until or None, tuple(methods)))
    chosen = Suite({name: suite.results[name] for name in compare.tasks},
                   {name: suite.training.get(name, {}) for name in compare.tasks},
                   {name: suite.grids[name] for name in compare.tasks if name in suite.grids})
    write_suite(out / "tasks", TASK_LENGTH, compare.seeds, chosen, settings)


def _load(out: Path, compare: CompareConfig, probe: str, step: int | None = None) -> dict[str, dict[int, dict]]:
    """encoding -> seed -> rows of one probe (on the snapshots at `step`), for what exists."""
    found: dict[str, dict[int, dict]] = {}
    for encoding in compare.encodings:
        for seed in compare.seeds:
            path = probe_path(out, encoding, seed, probe, step)
            if path.exists():
                found.setdefault(encoding, {})[seed] = json.loads(path.read_text())["rows"]
    return found


def _rows_by_length(found: dict[str, dict[int, dict]], lengths: list[str],
                    value: Callable[[dict[int, dict], str], str]) -> list[str]:
    """One table row per encoding: value(its rows by seed, length) for each probe length."""
    return [f"| {encoding} | " + " | ".join(value(rows, item) for item in lengths) + " |"
            for encoding, rows in found.items()]


def attention_summary(rows: dict[int, dict], item: str) -> dict[str, Estimate | None]:
    """Over seeds: each statistic's mean (over layers, heads, positions) within L and beyond L at one length."""
    summary: dict[str, Estimate | None] = {}
    for name in STATISTICS:
        for part in ("within_L", "beyond_L"):
            values = [float(np.mean(by_seed[item][name][part])) for by_seed in rows.values()
                      if "error" not in by_seed.get(item, {"error": 1}) and by_seed[item][name][part] is not None]
            summary[f"{name} {part}"] = t_interval(values)
        values = [float(np.mean(by_seed[item][name]["beyond_L"]) - np.mean(by_seed[item][name]["within_L"]))
                  for by_seed in rows.values()
                  if "error" not in by_seed.get(item, {"error": 1}) and by_seed[item][name]["beyond_L"] is not None]
        summary[f"{name} rise"] = t_interval(values)
    return summary


def uniform_rise(item: str, trained: int) -> str:
    """Mean ln(i + 1) over positions L..T-1 minus over 0..L-1: the entropy rise of uniform causal attention."""
    length = resolve_length(item, trained)
    if length <= trained:
        return "n/a"
    logs = np.log(np.arange(1, length + 1))
    return f"{logs[trained:].mean() - logs[:trained].mean():+.2f}"


def attention_section(results: ComparisonResults) -> list[str]:
    """The attention statistics within and beyond L per encoding and probe length, their figure, and the entropy
    rise beside each encoding's extrapolation penalty."""
    out, compare, trained = results.out, results.compare, results.trained
    found = _load(out, compare, "attention")
    if not found:
        return []
    lines = ["### Attention diagnostics", "",
             f"Per layer and head on {compare.probe_tokens:,} held-out tokens per length "
             "(eval/attention_diagnostics.py), "
             "averaged over layers, heads and query positions, mean [95% t interval] over seeds. Entropy in nats; "
             "'rise': the mean at positions >= L minus the mean at positions < L in the same windows; 'uniform rise': "
             "the same for attention spread evenly over the prefix (mean ln(i + 1)), the rise that more keys alone "
             "cause; far: the share on keys "
             "more than L back; sink: the share on the first 4 tokens.", "",
             *header("encoding @ length", ["entropy < L", "entropy >= L", "entropy rise", "uniform rise",
                                            "distance < L",
                                            "distance >= L", "sink share", "far share >= L"])]
    for encoding, rows in found.items():
        for item in compare.probe_lengths:
            s = attention_summary(rows, item)
            lines.append(f"| {encoding} @ {item} | {cell(s['entropy within_L'])} | {cell(s['entropy beyond_L'])} | "
                         f"{cell(s['entropy rise'], signed=True)} | {uniform_rise(item, trained)} | "
                         f"{cell(s['distance within_L'], 1)} | "
                         f"{cell(s['distance beyond_L'], 1)} | {cell(s['sink within_L'], 3)} | "
                         f"{cell(s['far beyond_L'], 3)} |")
    lines += ["", "![attention diagnostics](attention.png)", ""]
    plot_attention(found, compare, trained, out / "attention.png")
    longest = max(compare.probe_lengths, key=lambda item: resolve_length(item, trained))
    length = resolve_length(longest, trained)
    statements = []
    for encoding, rows in found.items():
        rise = attention_summary(rows, longest)["entropy rise"]
        estimate = results.penalty(encoding, length)
        if rise is not None:
            statements.append(f"{encoding}: entropy at positions >= L {rise.format(2, True)} nats against < L, "
                              f"penalty {cell(estimate, 3, True)} nats")
    if statements and length > trained:
        lines += [f"- At {longest}, attention entropy beside the extrapolation penalty: " + "; ".join(statements)
                  + ". A rise well beyond the uniform one with a positive penalty is attention spreading over "
                    "positions it never saw (attention dilution); a flat entropy with a flat penalty is an "
                    "encoding that keeps its attention local.", ""]
    return lines


def plot_attention(found: dict, compare: CompareConfig, trained: int, path: Path) -> None:
    longest = max(compare.probe_lengths, key=lambda item: resolve_length(item, trained))
    figure, axes = figures.new(4, width=18, height=4)
    titles = {"entropy": "entropy (nats)", "distance": "mean distance attended (tokens)",
              "sink": "share on the first 4 tokens", "far": "share on keys farther than L"}
    for encoding, rows in found.items():
        curves = {name: [curve(r[longest][name]) for r in rows.values() if "error" not in r.get(longest, {"error": 1})]
                  for name in STATISTICS}
        for axis, name in zip(axes, STATISTICS):
            if curves[name]:  # the seeds' curves share their bins: their mean per bin
                axis.plot(curves[name][0][0], np.mean([values for _, values in curves[name]], axis=0),
                          color=colour(encoding), linewidth=1.2, label=encoding)
    for axis, name in zip(axes, STATISTICS):
        axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
        axis.set_title(titles[name])
        axis.set_xlabel(f"query position (at {longest}; dotted: L)")
    figure.suptitle(f"Attention by query position at {longest}: mean over layers, heads and seeds "
                    f"(in bins of {-(-resolve_length(longest, trained) // BINS)} positions)")
    figures.save(figure, path, axes[0], below=True)


def induction_section(results: ComparisonResults) -> list[str]:
    compare, trained = results.compare, results.trained
    found = _load(results.out, compare, "induction")
    if not found:
        return []
    block = induction_block(trained)
    lines = ["### Induction probe", "",
             f"Sequences of the given length of random tokens whose last {block} repeat their first {block} (the "
             f"copies {block} tokens less than the length apart; {INDUCTION_TRIALS} trials per length; "
             "eval/induction.py): the loss on the first copy minus the loss on the second, in nats, mean [95% t "
             "interval] over seeds. Near 0: the model does not copy from that far back.", "",
             *header("encoding", list(compare.probe_lengths))]

    def gain(rows: dict[int, dict], item: str) -> str:
        values = [r[item]["gain"]["mean"] for r in rows.values() if "gain" in r.get(item, {})]
        return cell(t_interval(values), signed=True)

    return lines + _rows_by_length(found, compare.probe_lengths, gain) + [""]


def passkey_section(results: ComparisonResults) -> list[str]:
    compare = results.compare
    found = _load(results.out, compare, "passkey")
    if not found:
        return []
    lines = ["### Passkey retrieval", "",
             f"{compare.passkey_trials} trials per (length, depth) and seed at depths {PASSKEY_DEPTHS}, pooled over "
             "depths: accuracy, the mean over seeds [95% interval holding the t interval over seeds and the Wilson "
             "interval on all the trials; one seed: Wilson, trials only] (eval/passkey.py, eval/stats.py "
             "seeds_and_trials). Base models are not fine-tuned on the template, so 0 is expected of small ones; "
             "docs/evaluation.md's passkey recipe fine-tunes one.", "",
             *header("encoding", list(compare.probe_lengths))]

    def accuracy(rows: dict[int, dict], item: str) -> str:
        per_seed = [r[item] for r in rows.values() if isinstance(r.get(item), list)]
        correct = [sum(round(row["accuracy"] * row["trials"]) for row in seed) for seed in per_seed]
        trials = [sum(row["trials"] for row in seed) for seed in per_seed]
        estimate = seeds_and_trials(correct, trials)
        return cell(estimate)

    return lines + _rows_by_length(found, compare.probe_lengths, accuracy) + [""]


def tasks_section(results: ComparisonResults) -> list[str]:
    lines = []
    for name in results.compare.tasks:
        path = task_path(results.out, name)
        if not path.exists():
            continue
        saved = json.loads(path.read_text())
        by_encoding = saved["results"]
        multiples = list(next(iter(by_encoding.values())))
        cap, until = saved["settings"]["train"]["max_steps"], saved["settings"].get("until")
        budget = (f"until validation exact match at L reaches {until:g}, at most {cap:,} steps" if until
                  else f"{cap:,} steps")
        training = saved.get("training", {})
        lines += [f"### Task: {name}", "",
                  f"Trained per encoding and seed at L = {saved['length']} (experiments/tasks.py, model {DEFAULT_MODEL}, "
                  f"batches of {DEFAULT_TRAIN['batch_size']} sequences, {budget}), exact match on "
                  f"{saved['settings'].get('count', 256)} "
                  "fresh sequences per length: "
                  + rate_caption([row["exact_match"] for rows in by_encoding.values() for row in rows.values()])
                  + "; steps: each seed's (* reached the cap).", "", *header("encoding", multiples + ["steps"])]
        for encoding, by_length in by_encoding.items():
            steps = steps_cell(training.get(encoding, {}))
            lines.append(f"| {encoding} | " + " | ".join(
                rate_cell(row["exact_match"]) for row in by_length.values()) + f" | {steps} |")
        lines += ["", f"![{name}](tasks/{name}/{name}.png)", ""]
        if saved.get("grid"):
            lines += ["Answers at a set distance d before their queries, at each length (the grid), for each model and "
                      f"its window control (the same weights, attention limited to the last L = {saved['length']} "
                      "keys), 95% t intervals over seeds; the difference is paired by seed:", "",
                      *grid_table(saved["grid"])]
    return lines


def text_use(results: ComparisonResults) -> dict:
    """Variant label -> its use summary (experiments/compare/use.py), for what the use probe has measured."""
    return summarise_use(_load(results.out, results.compare, "use"), results.compare.use_margin,
                         "max" in results.compare.use_distances)


def text_use_section(results: ComparisonResults) -> list[str]:
    return use_section(text_use(results), results.trained, results.longest, results.compare.use_margin,
                       results.most_layers()) + budget_section(use_by_step(results), results.tokens_per_step,
                                                               results.trained, snapshot_penalties(results),
                                                               results.longest)


def snapshot_penalties(results: ComparisonResults) -> dict[str, dict[int, Estimate]]:
    """Variant label -> training step -> its penalty at the longest length, for the kept models and the final one
    (results.snapshots: where compare.snapshots kept models)."""
    return {name: {round(fraction * results.max_steps): penalty for fraction, penalty, _, _ in rows}
            for name, rows in results.snapshots.items()}


def use_by_step(results: ComparisonResults) -> dict[int, dict[str, UseSummary]]:
    """Training step -> variant label -> use summary: the models kept during training (compare.snapshot_probes)
    and the final ones (at the last step); empty when the snapshots were not probed."""
    if "use" not in results.compare.snapshot_probes:
        return {}
    first = next(iter(results.configs.values())).train
    by_step = {step: summarise_use(_load(results.out, results.compare, "use", step), results.compare.use_margin,
                                   "max" in results.compare.use_distances)
               for step in first.keep_steps}
    by_step[results.max_steps] = text_use(results)
    return {step: summaries for step, summaries in by_step.items() if summaries}


def report_sections(results: ComparisonResults) -> list[str]:
    """'Beyond perplexity': a section per probe and per task that has results (none: no heading)."""
    lines = text_use_section(results) + attention_section(results) + induction_section(results)
    lines += passkey_section(results) + tasks_section(results)
    return (["## Beyond perplexity", ""] + lines) if lines else []
