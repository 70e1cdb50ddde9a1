"""The comparison's outputs: table.md, the figures, report.md (with the findings of findings.py) and results.json.

Cells (variant x length) come from the cached per-token evaluations (eval/extrapolation.py):
  perplexity         exp of the mean NLL over seeds, with the Student's t 95% interval over seeds of the NLL,
                     exponentiated (experiments.seed_intervals.perplexity_interval: always > 0)
  ratio to own 1x    exp of the per-seed NLL difference, its t interval exponentiated (secondary: it mixes context
                     gain, the early-token curse and positions beyond L)
  penalty            tokens at positions >= L: loss in the k*L window minus loss in the L-window reference, nats;
                     95% Student's t interval over seeds on a standard error that adds the between-seed and the
                     between-window variance (experiments.seed_intervals.seeds_and_windows); none with one seed
  probe              L-windows with positions offset by 0, L, 3L, 15L: perplexity, as the perplexity cells
An ordering or a paper's claim is stated only where the 95% intervals do not overlap; otherwise "within noise".
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from commands import results_json
from data.batches import read_meta
from eval.extrapolation import CheckpointEvaluation
from eval.stats import bounded_t_interval
from experiments.compare.cells import cell, estimate_dict, table
from experiments.compare.extrapolation_map import map_findings, map_points, map_section, retrieval_tasks
from experiments.compare.findings import findings, snapshot_findings
from experiments.compare.layout import eval_path, invocations
from experiments.compare.plots import write_figures
from experiments.compare.probes import report_sections, snapshot_penalties, text_use, use_by_step
from experiments.compare.results import ComparisonResults
from experiments.compare.use import BUDGET_MULTIPLES, budget_columns, plot_use_budget
from model.methods import NONE, method_spec
from model.transformer import Transformer
from train.loop import position_group_settings

# How table.md states the perplexity and ratio intervals (experiments/compare/rerender.py reads it too).
PPL_NOTE = ("Perplexity: exp of the mean NLL over seeds, with the Student's t interval over seeds of the NLL, "
            "exponentiated (a geometric mean of the seeds' perplexities; the interval stays above 0). Ratios: exp "
            "of the per-seed NLL difference, its t interval exponentiated.")


def wall_time_line(results: ComparisonResults) -> str:
    """This invocation's wall time, and the total over every invocation recorded in OUT/invocations.jsonl."""
    records = invocations(results.out)
    line = (f"This invocation: {results.invocation.wall_s / 60:.1f} min wall on this machine "
            f"({results.invocation.machine})")
    if len(records) > 1:
        trained = [r for r in records if set(r.get("jobs", {})) != {"skipped"}]
        idle = [r for r in records if r not in trained]
        line += (f"; all {len(records)} invocations on record (OUT/invocations.jsonl), whatever each trained or "
                 f"reused: {sum(r['wall_s'] for r in records) / 60:.1f} min wall")
        if trained and idle:
            line += (f", of which {sum(r['wall_s'] for r in trained) / 60:.1f} min in the {len(trained)} that "
                     f"trained and {sum(r['wall_s'] for r in idle) / 60:.1f} min in the {len(idle)} that trained "
                     "nothing (they evaluated what was missing, or re-rendered the report from the cache)")
    return line


def tables_markdown(results: ComparisonResults) -> str:
    """table.md: perplexity, penalty and the ratio to each variant's own 1x, with what the intervals are."""
    variants, lengths, trained = results.variants, results.lengths, results.trained
    titles = [f"{length / trained:g}x" for length in lengths]
    ppl_lines = table(variants, lengths, titles, lambda v, n: cell(v.ppl(n)))
    penalty_lines = table(variants, results.penalty_lengths, [f"{n / trained:g}x" for n in results.penalty_lengths],
                          lambda v, n: cell(v.penalty_estimate(n), 3, signed=True))
    ratio_lines = table(variants, lengths, titles, lambda v, n: cell(v.ratio(n, lengths[0])))
    interval_note = (f"Each cell: {len(results.compare.seeds)} seed(s), estimate [95% interval]. {PPL_NOTE} Penalty: "
                     "Student's t interval over seeds on a standard "
                     "error that adds the between-seed and the between-window variance (the same windows in every "
                     "seed). With one seed there is no interval: one training run says nothing about the next "
                     "(RoPE's penalty at 16x was +0.72 and +1.01 nats for two trainings of one seed that differed "
                     "only in compiling; docs/results.md).")
    return "\n".join([
        "### Perplexity (nonoverlapping windows)", "", *ppl_lines, "",
        "### Extrapolation penalty (nats): positions >= L, window loss minus L-window reference loss", "",
        *penalty_lines, "",
        "### Perplexity relative to the same variant at 1x (secondary)", "", *ratio_lines, "",
        interval_note, ""])


def probe_table(results: ComparisonResults) -> list[str]:
    """The position-shift probe: perplexity of the L-windows at each offset, for the variants that have it."""
    offsets = results.probe_offsets
    return table(results.probe_variants, offsets, [f"offset {o // results.trained}L" for o in offsets],
                 lambda v, o: cell(v.probe_estimate(o)))


def use_budget_rows(results: ComparisonResults) -> list[dict]:
    """results.json's rows of use against the tokens trained (compare.snapshot_probes): one per variant, kept model
    and column (within L, 2L, 4L, 8L back)."""
    rows = []
    penalties = snapshot_penalties(results)
    for step, summaries in sorted(use_by_step(results).items()):
        for name, summary in summaries.items():
            penalty = penalties.get(name, {}).get(step)
            for title, index in budget_columns(summary, results.trained, BUDGET_MULTIPLES):
                rows.append({"label": name, "step": step, "tokens": step * results.tokens_per_step, "column": title,
                             "distance": summary.distances[index],
                             "window": summary.lengths[index] if summary.lengths else None,
                             "use": estimate_dict(summary.estimates[index]), "verdict": summary.verdicts[index],
                             "penalty": None if penalty is None else estimate_dict(penalty),
                             **({} if index >= len(summary.presence) or summary.presence[index] is None else
                                {"presence": estimate_dict(summary.presence[index]),
                                 "order": estimate_dict(summary.order[index])})})
    return rows


def results_record(results: ComparisonResults) -> dict:
    """results.json: the settings, every job's status, the training summaries and every number of the report."""
    compare, lengths, trained = results.compare, results.lengths, results.trained
    use = text_use(results)
    cells = []
    for name, variant in results.variants.items():
        for length in lengths:
            cells.append({"label": name, "encoding": variant.encoding, "method": variant.method, "length": length,
                          "multiple": length / trained,
                          "ppl_per_seed": {str(s): math.exp(v) for s, v in variant.nll.get(length, {}).items()},
                          "ppl": estimate_dict(variant.ppl(length)),
                          "ratio": estimate_dict(variant.ratio(length, lengths[0])),
                          "penalty": estimate_dict(variant.penalty_estimate(length)),
                          "error": variant.errors.get(length)})
    probes = [{"label": name, "offset": offset, "ppl": estimate_dict(v.probe_estimate(offset))}
              for name, v in results.probe_variants.items() for offset in results.probe_offsets]
    snapshot_rows = [{"label": encoding, "fraction": fraction, "penalty": estimate_dict(penalty),
                      "ppl_1x": estimate_dict(short), "ppl_longest": estimate_dict(long)}
                     for encoding, rows in results.snapshots.items() for fraction, penalty, short, long in rows]
    invocation = results.invocation
    return {
        "settings": {"compare": {k: getattr(compare, k) for k in compare.__dataclass_fields__},
                     "shared": results.shared, "trained_length": trained, "lengths": lengths,
                     "wall_s": invocation.wall_s, "workers": invocation.workers, "threads": invocation.threads,
                     "tokens_per_step": results.tokens_per_step, "max_steps": results.max_steps,
                     "machine": invocation.machine,
                     "runtime": vars(results.configs[(compare.encodings[0], compare.seeds[0])].runtime),
                     "parameters": results.parameters},
        "status": dict(results.statuses),
        "training": {e: {str(s): t for s, t in by_seed.items()} for e, by_seed in results.training.items()},
        "attention_paths": attention_paths(results),
        "cells": cells, "probe": probes, "snapshots": snapshot_rows, "use_by_step": use_budget_rows(results),
        "map": [{"label": point.label, "harm": estimate_dict(point.harm),
                 "text_window": estimate_dict(point.text_window), "verdict": point.verdict,
                 **{key: {task: estimate_dict(value) for task, value in getattr(point, key).items()}
                    for key in ("use", "control", "difference")},
                 "text_use": estimate_dict(point.text_use),
                 "reads_back": point.text.reads_back() if point.text else None}
                for point in (map_points(results, use) if retrieval_tasks(results) or use else [])]}


def attention_paths(results: ComparisonResults) -> dict[str, dict]:
    """encoding -> the attention path of its first seed's layers in training and at each evaluation length as
    trained (model/attention/registry.py), from its trainer state and its cached evaluation."""
    found = {}
    seed = results.compare.seeds[0]
    for encoding in results.compare.encodings:
        summary = results.training.get(encoding, {}).get(seed) or {}
        path = eval_path(results.out, encoding, seed)
        evaluated = CheckpointEvaluation.load(path).paths if path.exists() else {}
        found[encoding] = {"training": summary.get("attention_paths"),
                           "evaluation": {key: paths for key, paths in evaluated.items()
                                          if key.startswith(f"{NONE}@")}}
    return found


def write_outputs(results: ComparisonResults) -> None:
    """table.md, the figures, report.md and results.json in OUT, from whatever finished (failed jobs are listed)."""
    out = results.out
    (out / "table.md").write_text(tables_markdown(results))
    write_figures(results)
    by_step = use_by_step(results)
    if len(by_step) > 1:
        plot_use_budget(by_step, results.tokens_per_step, results.trained, out / "use_budget.png")
    (out / "report.md").write_text(report_markdown(results))
    (out / "results.json").write_text(results_json(results_record(results)))


def report_markdown(results: ComparisonResults) -> str:
    """report.md: how it was run, the setup, the tables and figures, the probe and task sections, the findings."""
    compare, configs, training, variants = results.compare, results.configs, results.training, results.variants
    lengths, trained, invocation = results.lengths, results.trained, results.invocation
    max_steps, tokens_per_step, snapshots = results.max_steps, results.tokens_per_step, results.snapshots
    meta = read_meta(results.data_dir)
    train = results.shared.get("train", {})
    model = {key: value for key, value in results.shared.get("model", {}).items() if key != "position_args"}
    params = results.parameters
    longest = results.longest
    methods = [m for m in compare.methods if m != NONE]
    train_minutes = sum(s["wall_s"] for by_seed in training.values() for s in by_seed.values() if s) / 60
    eval_minutes = sum(CheckpointEvaluation.load(path).seconds for path in Path(compare.out, "evals").rglob("*.npz")
                       if not path.name.endswith(".tmp.npz")) / 60
    lines = [
        f"# Position-encoding extrapolation ({invocation.preset} preset)", "",
        f"Reproduce: `{invocation.command}`. {wall_time_line(results)}, {invocation.workers} worker "
        f"process(es) x {invocation.threads} thread(s). Process time summed over all jobs, whenever they ran: "
        f"training {train_minutes:.1f} min, evaluation {eval_minutes:.1f} min. Re-running skips what is done.", "",
        "## Setup", "",
        f"- Data: `{compare.source}`: {meta['train_documents']} training documents ({meta['train_tokens']:,} tokens), "
        f"{meta['val_documents']} held-out documents ({meta['val_tokens']:,} tokens; "
        f"{meta.get('split', 'document hash')}) never trained on; byte-level BPE with {meta['vocab_size']} tokens."
        + (f" Held out: {', '.join(meta['val_names'][:12])}." if meta.get("val_names") else ""),
        f"- Every variant: {json.dumps(model)}; training {json.dumps(train)}; "
        f"{max_steps * tokens_per_step:,} training tokens each; only `model.position` differs"
        + ("" if not (own := {name: settings for name in compare.encodings
                              if len(settings := compare.model_settings(name, results.shared.get("model"))) > 1}) else
           " (and the settings listed here: " + "; ".join(f"{name}: {json.dumps(settings)}"
                                                          for name, settings in own.items()) + ")")
        + ("" if not (own_train := {name: compare.train_settings[name] for name in compare.encodings
                                    if compare.train_settings.get(name)}) else
           "; each encoding's own training settings over the shared ones (compare.train_settings, chosen in "
           "docs/baselines.md): " + "; ".join(f"{name}: {json.dumps(settings)}"
                                              for name, settings in own_train.items()))
        + ". "
        f"Seeds {compare.seeds}: each seed sets the initialisation and the data order, shared by all encodings.",
        f"- Evaluation: {compare.eval_tokens:,} held-out tokens requested per cell, in segments of "
        f"{longest:,} tokens spread evenly over all held-out documents; every length "
        f"({', '.join(compare.lengths)} of L = {trained}) scores the same tokens with nonoverlapping windows. "
        f"The L-window reference scores them again with windows of L tokens advancing by "
        f"{compare.reference_stride or max(1, trained // 8)} (context between 7/8 L and L, all positions < L). "
        f"Inference-time methods: {', '.join(f'{m} ({method_spec(m).summary})' for m in methods) or 'none'}.",
        "",
        "| encoding | parameters | position parameters: lr scale, weight decay | training tokens | wall time per run "
        "| tokens/s | val loss (step 0 -> end) | status |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for encoding in compare.encodings:
        summaries = [s for s in training[encoding].values() if s]
        statuses = sorted({results.statuses.get(f"{encoding}-seed{seed}", {}).get("status", "not run")
                           for seed in compare.seeds})
        config = configs[(encoding, compare.seeds[0])]
        model_ = Transformer(config.model)
        optimiser = "none (no parameters)"
        learned = [e for e in model_.position_encodings() if any(True for _ in e.parameters())]
        if learned:
            settings = position_group_settings(model_, config, learned[0])
            optimiser = f"x{settings['lr_scale']:g}, {settings['weight_decay']:g}"
        if summaries:
            speed = [s["tok_per_s"] for s in summaries if s["tok_per_s"]]
            val = bounded_t_interval([s["val_loss"] for s in summaries], low=0.0)
            initial = statistics.fmean(s["initial_val_loss"] for s in summaries)
            lines.append(f"| {encoding} | {params[encoding]:,} | {optimiser} | {summaries[0]['tokens']:,} | "
                         f"{statistics.fmean(s['wall_s'] for s in summaries):.0f} s | "
                         f"{f'{statistics.fmean(speed):,.0f}' if speed else ''} | {initial:.3f} -> {cell(val, 3)} | "
                         f"{'; '.join(statuses)} |")  # no speed: a run too short to log twice
        else:
            lines.append(f"| {encoding} | {params[encoding]:,} | {optimiser} | | | | | {'; '.join(statuses)} |")
    probe_lines = probe_table(results)
    lines += ["", "## Results", "", tables_markdown(results), "![perplexity vs length](plot.png)", "",
              "### The extrapolation penalty", "",
              "Nonoverlapping windows of k*L mix three effects: (k-1)/k of their tokens lie beyond L, those tokens "
              "also have more context, and the first tokens of every window have little (the early-token curse). "
              "The penalty isolates the first two for tokens at positions >= L by comparing each with its own loss "
              "under an L-token sliding window: > 0 means the model loses more from the unseen positions than it "
              "gains from the extra context.", "", "![penalty vs length](penalty.png)", "",
              "![penalty by position](position_loss.png)", "", *map_section(results, text_use(results))]
    if probe_lines and len(probe_lines) > 2:
        lines += ["### Position-shift probe", "",
                  "The L-token windows of the 1x cell, scored with all positions offset; the context is unchanged, so "
                  "a relative encoding gives identical numbers and an absolute one shows how it treats positions it "
                  "never saw (perplexity: exp of the mean NLL over seeds [its 95% t interval, exponentiated]).", "", *probe_lines, ""]
    if snapshots:
        lines += ["### Extrapolation against training tokens", "",
                  f"Models kept at fractions of the {max_steps}-step schedule (the learning rate was still high at "
                  "the earlier ones), evaluated like the final ones.", "",
                  "| variant | training tokens | ppl at 1x | ppl at longest | penalty at longest (nats) |",
                  "|---|---:|---:|---:|---:|"]
        for encoding, rows in snapshots.items():
            for fraction, penalty, short, long in rows:
                lines.append(f"| {encoding} | {fraction * max_steps * tokens_per_step:,.0f} ({fraction:g}) | "
                             f"{cell(short)} | {cell(long)} | {cell(penalty, 3, signed=True)} |")
        lines += ["", "![penalty against training tokens](snapshots.png)", ""]
    lines += report_sections(results)
    lines += ["## Training curves", "", "![training curves](train_curves.png)", "", "## What this shows", ""]
    lines += findings(variants, lengths, trained, results.probe_offsets)
    lines += map_findings(map_points(results, text_use(results)))
    lines += snapshot_findings(snapshots, max_steps * tokens_per_step, longest / trained)
    lines += ["", "The paper's setting differs (word-level WikiText-103, 247M parameters, L = 512); these are small "
              "models trained for minutes, so sizes of effects do not transfer, and statements above hold only "
              "within the stated intervals."]
    return "\n".join(lines) + "\n"
