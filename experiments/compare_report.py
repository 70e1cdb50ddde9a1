"""The comparison's report from its records: table.md, report.md and the figures (experiments/render.py writes them).

Cells (variant x length):
  perplexity         exp of the mean NLL over seeds, with the Student's t 95% interval over seeds of the NLL,
                     exponentiated (eval.stats.perplexity_interval: always > 0)
  ratio to own 1x    exp of the per-seed NLL difference, its t interval exponentiated (secondary: it mixes context
                     gain, the early-token curse and positions beyond L)
  penalty            tokens at positions >= L: loss in the k*L window minus loss in the L-window reference, nats;
                     95% Student's t interval over seeds on a standard error that adds the between-seed and the
                     between-window variance (eval.stats.seeds_and_windows); none with one seed
  probe              L-windows with positions offset by 0, L, 3L, 15L: perplexity, as the perplexity cells
An ordering or a paper's claim is stated only where the intervals allow (eval/verdicts.py); otherwise "within noise".
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from eval import figures
from eval.attention_diagnostics import mean_curves, over_seeds, uniform_rise
from eval.attention_diagnostics import plot as plot_attention
from eval.extrapolation import key_for, resolve_length
from eval.figures import colour
from eval.induction import FLEET_TRIALS, fleet_block
from eval.passkey import FLEET_DEPTHS
from eval.stats import (
    Estimate,
    bounded_t_interval,
    perplexity_interval,
    perplexity_ratio_interval,
    seeds_and_trials,
    seeds_and_windows,
    t_interval,
)
from eval.use import WINDOW_CONTROL, UseSummary, default_span, fleet_windows, summaries_from_estimates, summarise_fleet
from eval.verdicts import (
    FLAT,
    MAP_ORDER,
    PENALTY_MEANINGS,
    USE_RULE,
    differs,
    impossible_use,
    map_reading,
    movement,
    negative_word,
    order_chain,
    penalty_claim,
    penalty_side,
    ratio_claim,
    ratio_word,
    relay_reach,
    separated_pairs,
    threshold_claim,
)
from experiments import tasks
from experiments.engine import Records
from experiments.render import bands, bars, cell, estimate_of, header, provenance, published, table, write
from model.encodings import POSITION_ENCODINGS
from model.methods import NONE, label, method_spec
from train.trackers import log_summary

PPL_NOTE = ("Perplexity: exp of the mean NLL over seeds, with the Student's t interval over seeds of the NLL, "
            "exponentiated (a geometric mean of the seeds' perplexities; the interval stays above 0). Ratios: exp "
            "of the per-seed NLL difference, its t interval exponentiated.")
PROBE_NOTE = "perplexity: exp of the mean NLL over seeds [its 95% t interval, exponentiated]"
TEXT_USE_DISTANCE = 4  # the map's text panel: use of passages 4L apart, in multiples of L
BUDGET_MULTIPLES = (2, 4, 8)  # use against the tokens trained: distances in multiples of L


@dataclass
class Variant:
    """One row of the report: an encoding (or named variant) as trained or under one method, per length and seed."""

    encoding: str
    method: str
    label: str
    nll: dict[int, dict[int, float]] = field(default_factory=dict)  # length -> seed -> nll
    penalty: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # length -> seed -> per-window penalty
    curves: dict[int, list[float]] = field(default_factory=dict)  # seed -> binned penalty by position, longest length
    probe: dict[int, dict[int, float]] = field(default_factory=dict)  # offset -> seed -> nll
    errors: dict[int, str] = field(default_factory=dict)  # length -> why no number
    # ("penalty", length), ("probe", offset) or ("difference", other label, length) -> the estimate a migrated
    # study's committed summary kept, where its records keep no per-window values
    fixed: dict[tuple, Estimate] = field(default_factory=dict)

    def ppl(self, length: int) -> Estimate | None:
        return perplexity_interval(list(self.nll.get(length, {}).values()))

    def ratio(self, length: int, base: int) -> Estimate | None:
        return self.change(self, length, base)

    def change(self, other: "Variant", length: int, base: int | None = None) -> Estimate | None:
        """This variant's perplexity at `length` over `other`'s (at `base`), paired by seed."""
        here, there = self.nll.get(length, {}), other.nll.get(length if base is None else base, {})
        seeds = [s for s in here if s in there]
        return perplexity_ratio_interval([here[s] for s in seeds], [there[s] for s in seeds])

    def penalty_estimate(self, length: int) -> Estimate | None:
        by_seed = self.penalty.get(length, {})
        if not by_seed:
            return self.fixed.get(("penalty", length))
        return seeds_and_windows(np.stack([by_seed[s] for s in sorted(by_seed)]))

    def nll_difference(self, other: "Variant", length: int) -> Estimate | None:
        here, there = self.nll.get(length, {}), other.nll.get(length, {})
        return t_interval([here[seed] - there[seed] for seed in sorted(here) if seed in there])

    def penalty_difference(self, other: "Variant", length: int) -> Estimate | None:
        here, there = self.penalty.get(length, {}), other.penalty.get(length, {})
        seeds = [seed for seed in sorted(here) if seed in there]
        if not seeds:
            return self.fixed.get(("difference", other.label, length))
        return seeds_and_windows(np.stack([here[seed] - there[seed] for seed in seeds]))

    def probe_estimate(self, offset: int) -> Estimate | None:
        return perplexity_interval(list(self.probe.get(offset, {}).values())) or self.fixed.get(("probe", offset))

    @property
    def probed(self) -> list[int]:
        return sorted({*self.probe, *(where[1] for where in self.fixed if where[0] == "probe")})


def positive(estimate: Estimate | None) -> Estimate | None:
    """A perplexity a migrated record kept with its interval: the interval dropped where it reaches 0 (a t interval
    on raw perplexity, made before intervals moved to the log scale, cut at the range's edge)."""
    if estimate is None or estimate.low is None or estimate.low > 0:
        return estimate
    return Estimate(estimate.mean, None, None, estimate.n)


class Comparison:
    """What the report reads, from the records: settings, the model cells' records, the variants built from them."""

    def __init__(self, records: Records) -> None:
        self.records, self.settings, self.out = records, records.settings, records.out
        self.models = [(cell, record) for cell, record in records.done() if cell["kind"] == "model"]
        self.task_records = [(cell, record) for cell, record in records.done() if cell["kind"] == "task"]
        # a study migrated from a folder of results.json and report.md: the estimates only they kept
        self.committed = next((record for cell, record in records.done() if cell["kind"] == "committed"), None)
        first = next(cell for cell in records.cells if cell["kind"] == "model")
        self.trained = first["run"]["model"].get("max_seq_len") or 256
        self.lengths = sorted({resolve_length(item, self.trained) for item in self.settings.lengths})
        self.longest = max(self.lengths)
        self.max_steps = first["run"]["train"].get("max_steps", 1000)
        self.keep_steps = first["run"]["train"]["keep_steps"]
        train = first["run"]["train"]
        self.tokens_per_step = train.get("batch_size", 16) * train.get("grad_accum", 1) * self.trained
        self.layers = max(cell["run"]["model"].get("n_layers", 4) for cell in records.cells if cell["kind"] == "model")

    @property
    def penalty_lengths(self) -> list[int]:
        return [n for n in self.lengths if n > self.trained]

    def methods_of(self, encoding: str) -> list[str]:
        cell = next((c for c in self.records.cells if c["kind"] == "model" and c["encoding"] == encoding), None)
        return [NONE] + [m for m in (cell["methods"] if cell else []) if m != NONE]

    @cached_property
    def variants(self) -> dict[str, Variant]:
        found: dict[str, Variant] = {}
        for encoding in self.settings.encodings:
            for method in self.methods_of(encoding):
                found[label(encoding, method)] = Variant(encoding, method, label(encoding, method))
        for model, record in self.models:
            evaluation, seed = record["evaluation"], model["seed"]
            for method in self.methods_of(model["encoding"]):
                variant = found[label(model["encoding"], method)]
                for length in self.lengths:
                    key = key_for(method, length)
                    if key not in evaluation["nll"]:
                        variant.errors[length] = evaluation["errors"].get(key, "not evaluated")
                        continue
                    variant.nll.setdefault(length, {})[seed] = evaluation["nll"][key]
                    if key in evaluation["penalty"]:
                        variant.penalty.setdefault(length, {})[seed] = np.asarray(  # float32 means, as measured
                            evaluation["penalty"][key], dtype=np.float32).astype(np.float64)
                if method in evaluation["curve"]:
                    variant.curves[seed] = evaluation["curve"][method]
                for key, nll in evaluation["probe"].items():
                    name, offset = key.rsplit("@", 1)
                    if name == method:
                        variant.probe.setdefault(int(offset), {})[seed] = nll
        for kind in ("penalty", "probe", "penalty_difference") if self.committed else ():
            for where, saved in self.committed.get(kind, {}).items():
                name, at = where.rsplit("@", 1)
                name, _, other = name.partition("|")  # a difference: "variant|baseline"
                if name in found:
                    where = (kind, int(at)) if not other else ("difference", other, int(at))
                    found[name].fixed[where] = estimate_of(saved)
        return {name: variant for name, variant in found.items() if variant.nll}

    @property
    def probe_offsets(self) -> list[int]:
        return sorted({offset for v in self.variants.values() for offset in v.probed})

    @cached_property
    def snapshots(self) -> dict[str, list[tuple[float, Estimate, Estimate | None, Estimate | None]]]:
        """label -> [(fraction, penalty at the longest length, ppl at 1x, ppl at the longest)], the kept models and
        the final one, for each encoding as trained and under each snapshot method."""
        if self.committed and self.committed["snapshots"]:
            found: dict[str, list] = {}
            for row in self.committed["snapshots"]:
                found.setdefault(row["label"], []).append((row["fraction"], estimate_of(row["penalty"]),
                                                           positive(estimate_of(row["ppl_1x"])),
                                                           positive(estimate_of(row["ppl_longest"]))))
            return found
        if not self.keep_steps:
            return {}
        shortest, table_ = min(self.lengths), {}
        for encoding in self.settings.encodings:
            chosen = [(c, r) for c, r in self.models if c["encoding"] == encoding]
            methods = [NONE] + (chosen[0][0]["snapshot_methods"] if chosen else [])
            for method in methods:
                rows = []
                for step in [*self.keep_steps, None]:
                    windows, long, short = [], [], []
                    for _, record in chosen:
                        evaluation = record["evaluation"] if step is None else record["snapshots"].get(str(step))
                        penalty = (evaluation or {}).get("penalty", {}).get(key_for(method, self.longest))
                        if penalty is None:
                            continue
                        windows.append(penalty)
                        short.append(evaluation["nll"][key_for(method, shortest)])
                        long.append(evaluation["nll"][key_for(method, self.longest)])
                    if windows:
                        rows.append(((step or self.max_steps) / self.max_steps, seeds_and_windows(np.stack(windows)),
                                     perplexity_interval(short), perplexity_interval(long)))
                if rows:
                    table_[label(encoding, method)] = rows
        return table_

    def probe_records(self, probe: str, step: int | None = None) -> dict[str, list]:
        """encoding -> its seeds' records of one probe (of the kept models at `step`)."""
        found: dict[str, list] = {encoding: [] for encoding in self.settings.encodings}
        for model, record in self.models:
            probes = record["probes"] if step is None else record["snapshot_probes"].get(str(step), {})
            rows = probes.get(probe)
            if rows is not None:
                found[model["encoding"]].append(rows)
        return {encoding: rows for encoding, rows in found.items() if rows}

    @cached_property
    def use(self) -> dict[str, UseSummary]:
        if self.committed:
            return committed_use(self.committed["use"], self.settings, committed_df(self))
        return summarise_fleet(self.probe_records("use"), self.settings.use_margin, "max" in self.settings.use_distances)

    @cached_property
    def use_by_step(self) -> dict[int, dict[str, UseSummary]]:
        if self.committed:
            return {int(step): committed_use(use, self.settings, committed_df(self))
                    for step, use in self.committed["use_by_step"].items()}
        if "use" not in self.settings.snapshot_probes:
            return {}
        found = {step: summarise_fleet(self.probe_records("use", step), self.settings.use_margin,
                                       "max" in self.settings.use_distances) for step in self.keep_steps}
        found[self.max_steps] = self.use
        return {step: summaries for step, summaries in found.items() if summaries}

    def training(self, encoding: str) -> list[dict]:
        return [record["training"] for cell, record in self.models if cell["encoding"] == encoding]


def committed_df(c: "Comparison"):
    """The degrees of freedom of a migrated study's use intervals: over seeds, or over one seed's windows."""
    seeds, val_tokens = len(c.settings.seeds), c.models[0][1]["data"].get("val_tokens", 0) if c.models else 0
    windows = fleet_windows(c.settings.use_windows, c.trained, c.longest, val_tokens)
    return lambda length: seeds - 1 if seeds > 1 else windows.get(length, c.settings.use_windows) - 1


def committed_use(use: dict, settings, df) -> dict[str, UseSummary]:
    return summaries_from_estimates(use.get("cells", {}), use.get("reach", {}), use.get("across", {}),
                                    use.get("priming", {}), settings.use_margin, "max" in settings.use_distances,
                                    df) if use else {}


# --------------------------------------------------------------------------------------------------- tables

def tables_markdown(c: Comparison) -> str:
    variants, lengths, trained = c.variants, c.lengths, c.trained
    titles = [f"{length / trained:g}x" for length in lengths]
    penalty = (c.committed or {}).get("penalty_interval") or (  # a migrated study's estimates keep their own rule
        "Student's t interval over seeds on a standard error that adds the between-seed and the between-window "
        "variance (the same windows in every seed)")
    note = (f"Each cell: {len(c.settings.seeds)} seed(s), estimate [95% interval]. {PPL_NOTE} Penalty: {penalty}. "
            "With one seed there is no interval: one training run says nothing about the next (RoPE's penalty at 16x "
            "was +0.72 and +1.01 nats for two trainings of one seed that differed only in compiling; docs/results.md).")
    return "\n".join([
        "### Perplexity (nonoverlapping windows)", "", *table(variants, lengths, titles, lambda v, n: cell(v.ppl(n))),
        "", "### Extrapolation penalty (nats): positions >= L, window loss minus L-window reference loss", "",
        *table(variants, c.penalty_lengths, [f"{n / trained:g}x" for n in c.penalty_lengths],
               lambda v, n: cell(v.penalty_estimate(n), 3, signed=True)), "",
        "### Perplexity relative to the same variant at 1x (secondary)", "",
        *table(variants, lengths, titles, lambda v, n: cell(v.ratio(n, lengths[0]))), "", note, ""])


def setup_lines(c: Comparison) -> list[str]:
    settings, meta = c.settings, c.models[0][1]["data"] if c.models else {}
    model = {key: value for key, value in settings.model.items() if key != "position_args"}
    own = {name: s for name in settings.encodings if len(s := settings.model_settings(name)) > 1}
    own_train = {name: settings.train_settings[name] for name in settings.encodings if settings.train_settings.get(name)}
    methods = [m for m in settings.methods if m != NONE]
    held = f" Held out: {', '.join(meta['val_names'][:12])}." if meta.get("val_names") else ""
    lines = [
        "## Setup", "",
        f"- Data: `{settings.source}`: {meta.get('train_documents')} training documents "
        f"({meta.get('train_tokens', 0):,} tokens), {meta.get('val_documents')} held-out documents "
        f"({meta.get('val_tokens', 0):,} tokens; {meta.get('split', 'document hash')}) never trained on; byte-level "
        f"BPE with {meta.get('vocab_size')} tokens." + held,
        f"- Every variant: {json.dumps(model)}; training {json.dumps(settings.train)}; "
        f"{c.max_steps * c.tokens_per_step:,} training tokens each; only `model.position` differs"
        + ("" if not own else " (and the settings listed here: " + "; ".join(
            f"{name}: {json.dumps(s)}" for name, s in own.items()) + ")")
        + ("" if not own_train else "; each encoding's own training settings over the shared ones "
           "(compare.train_settings, chosen in docs/baselines.md): " + "; ".join(
               f"{name}: {json.dumps(s)}" for name, s in own_train.items()))
        + f". Seeds {settings.seeds}: each seed sets the initialisation and the data order, shared by all encodings.",
        f"- Evaluation: {settings.eval_tokens:,} held-out tokens requested per cell, in segments of {c.longest:,} "
        f"tokens spread evenly over all held-out documents; every length ({', '.join(settings.lengths)} of L = "
        f"{c.trained}) scores the same tokens with nonoverlapping windows. The L-window reference scores them again "
        f"with windows of L tokens advancing by {settings.reference_stride or max(1, c.trained // 8)} (context between "
        f"7/8 L and L, all positions < L). Inference-time methods: "
        f"{', '.join(f'{m} ({method_spec(m).summary})' for m in methods) or 'none'}.", "",
        "| encoding | parameters | position parameters: lr scale, weight decay | training tokens | wall time per run "
        "| tokens/s | val loss (step 0 -> end) | status |", "|---|---:|---|---:|---:|---:|---|---|"]
    for encoding in settings.encodings:
        summaries = c.training(encoding)
        statuses = sorted({r["status"] for cl, r in c.models if cl["encoding"] == encoding} or {"not run"})
        if not summaries:
            lines.append(f"| {encoding} | | | | | | | {'; '.join(statuses)} |")
            continue
        first, speed = summaries[0], [s["tok_per_s"] for s in summaries if s["tok_per_s"]]
        val = bounded_t_interval([s["val_loss"] for s in summaries], low=0.0)
        lines.append(f"| {encoding} | {first['parameters']:,} | {first['position_optimiser']} | {first['tokens']:,} | "
                     f"{statistics.fmean(s['wall_s'] for s in summaries):.0f} s | "
                     f"{f'{statistics.fmean(speed):,.0f}' if speed else ''} | "
                     f"{statistics.fmean(s['initial_val_loss'] for s in summaries):.3f} -> {cell(val, 3)} | "
                     f"{'; '.join(statuses)} |")
    return lines


def report(records: Records) -> None:
    """table.md, the figures and report.md in OUT, from whatever cells have records."""
    c = Comparison(records)
    out, trained = c.out, c.trained
    write(out, "table.md", tables_markdown(c))
    trackers = c.settings.train.get("report_to", [])
    if [name for name in trackers if name != "jsonl"]:  # the tables as a run of the comparison's tracker group
        log_summary(trackers, out, f"compare:{Path(c.settings.out).name}", tables_markdown(c),
                    {f"{name}/ppl_{n / trained:g}x": e.mean for name, v in c.variants.items() for n in c.lengths
                     if (e := v.ppl(n)) is not None})
    write_figures(c)
    seconds = [s for cl in records.cells if (s := records.seconds(cl)) is not None]
    train_minutes = sum(s["wall_s"] for encoding in c.settings.encodings for s in c.training(encoding)) / 60
    eval_minutes = (sum(r["evaluation"]["seconds"] for _, r in c.models)  # a migrated study's: its summary's
                    + (c.committed or {}).get("evaluation_s", 0.0)) / 60
    lines = [f"# Position-encoding extrapolation ({records.preset or Path(c.settings.out).name} preset)", "",
             f"{provenance(records.invocations, seconds)} Of it, training {train_minutes:.1f} min, evaluation "
             f"{eval_minutes:.1f} min. Re-running measures only what has no record.", "",
             *[line for note in (c.committed or {}).get("notes", []) for line in (note, "")], *setup_lines(c)]
    if records.missing():
        lines += ["", f"Not measured yet ({len(records.missing())} cells): "
                  + ", ".join(cl["name"] for cl in records.missing()) + "."]
    lines += ["", "## Results", "", tables_markdown(c), "![perplexity vs length](plot.png)", "",
              "### The extrapolation penalty", "",
              "Nonoverlapping windows of k*L mix three effects: (k-1)/k of their tokens lie beyond L, those tokens "
              "also have more context, and the first tokens of every window have little (the early-token curse). "
              "The penalty isolates the first two for tokens at positions >= L by comparing each with its own loss "
              "under an L-token sliding window: > 0 means the model loses more from the unseen positions than it "
              "gains from the extra context.", "", "![penalty vs length](penalty.png)", "",
              *(["![penalty by position](position_loss.png)", ""] if curved(c) else []), *map_section(c)]
    offsets = c.probe_offsets
    probe_rows = table({n: v for n, v in c.variants.items() if v.probed}, offsets,
                       [f"offset {o // trained}L" for o in offsets], lambda v, o: cell(v.probe_estimate(o)))
    if len(probe_rows) > 2:
        lines += ["### Position-shift probe", "",
                  "The L-token windows of the 1x cell, scored with all positions offset; the context is unchanged, so "
                  "a relative encoding gives identical numbers and an absolute one shows how it treats positions it "
                  f"never saw ({(c.committed or {}).get('probe_interval') or PROBE_NOTE}).", "",
                  *probe_rows, ""]
    if c.snapshots:
        lines += ["### Extrapolation against training tokens", "",
                  f"Models kept at fractions of the {c.max_steps}-step schedule (the learning rate was still high at "
                  "the earlier ones), evaluated like the final ones.", "",
                  "| variant | training tokens | ppl at 1x | ppl at longest | penalty at longest (nats) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {fraction * c.max_steps * c.tokens_per_step:,.0f} ({fraction:g}) | {cell(short)} | "
                  f"{cell(long)} | {cell(penalty, 3, signed=True)} |"
                  for name, rows in c.snapshots.items() for fraction, penalty, short, long in rows]
        lines += ["", "![penalty against training tokens](snapshots.png)", ""]
    beyond = use_section(c) + budget_section(c) + attention_section(c) + induction_section(c) + passkey_section(c)
    beyond += tasks.comparison_section(c.task_records, c.settings, out) if c.task_records else []
    lines += (["## Beyond perplexity", ""] + beyond if beyond else [])
    lines += ["## Training curves", "", "![training curves](train_curves.png)", "", "## What this shows", "",
              *findings(c), *map_findings(map_points(c)), *snapshot_findings(c), "",
              "The paper's setting differs (word-level WikiText-103, 247M parameters, L = 512); these are small "
              "models trained for minutes, so sizes of effects do not transfer, and statements above hold only "
              "within the stated intervals."]
    write(out, "report.md", "\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------- findings

def loss_differs(variants: dict[str, Variant], length: int):
    return lambda a, b: differs(variants[a].nll_difference(variants[b], length))


def absolute_gap(variants: dict[str, Variant], variant: Variant, first: int) -> str:
    """For an absolute encoding, its 1x perplexity against RoPE's, the gap every claim about it should be read with."""
    encoding, rope = POSITION_ENCODINGS.get(variant.encoding), variants.get("rope")
    if encoding is None or encoding.per_layer or rope is None or not rope.ppl(first) or not variant.ppl(first):
        return ""
    ratio = variant.ppl(first).mean / rope.ppl(first).mean
    return (f" (absolute encoding; its 1x perplexity is {ratio:.2f}x RoPE's, "
            f"{'within' if abs(ratio - 1) <= 0.10 else 'not within'} 10%)")


def findings(c: Comparison) -> list[str]:
    variants, lengths, trained = c.variants, c.lengths, c.trained
    if not variants:
        return ["No variant could be evaluated; see the status column above."]
    first, longest = min(lengths), max(lengths)
    as_trained = {name: v for name, v in variants.items() if v.method == NONE}
    ordered = as_trained if as_trained and len(as_trained) < len(variants) else variants
    lines = []
    for length in sorted({first, longest}):
        estimates = [(v.ppl(length), name) for name, v in ordered.items() if v.ppl(length)]
        chain = order_chain(estimates, differ=loss_differs(ordered, length))
        if chain:
            lines.append(f"- Perplexity at {length / trained:g}x, best to worst: {chain}.")
            pairs = separated_pairs(estimates, loss_differs(ordered, length))
            if pairs:
                lines.append(f"  Pairs that differ at {length / trained:g}x (better < worse): {pairs}.")
    lines.append("  ('<': the loss difference of the two, paired by seed, has a 95% t interval that excludes 0; '≈': "
                 "it does not, so the order is within noise; '≈' is not transitive, hence the pairs.)")
    if ordered is not variants:
        lines.append("  (The encodings as trained; each inference-time method against the same trained models: "
                     "below, paired by seed.)")
    penalties = [f"{v.label} {e.format(3, signed=True)} nats: {PENALTY_MEANINGS[penalty_side(e)]}"
                 f"{absolute_gap(variants, v, first)}" for v in ordered.values()
                 if (e := v.penalty_estimate(longest)) is not None]
    if penalties:
        lines.append(f"- Extrapolation penalty at {longest / trained:g}x (positions >= L against the L-window "
                     "reference): " + "; ".join(penalties) + ".")
    grouped: dict[str, list[tuple[float, str]]] = {"above": [], "below": [], "flat": [], "noise": [], "single": []}
    for variant in variants.values():
        estimate = variant.penalty_estimate(longest)
        if estimate is not None:
            grouped[penalty_side(estimate)].append((estimate.mean, f"{variant.label} ({estimate.mean:+.3f})"))
    names = {side: ", ".join(name for _, name in sorted(items, reverse=side == "above")) or "none"
             for side, items in grouped.items()}
    lines.append(f"- At {longest / trained:g}x, largest penalty first. Degrade beyond L (interval above 0): "
                 f"{names['above']}. Flat (interval within +-{FLAT} nats, i.e. +-1% perplexity): {names['flat']}. "
                 f"Gain from the longer context (interval below 0): {names['below']}. "
                 f"Within noise of 0: {names['noise']}." + (f" One seed, so no interval: {names['single']}."
                                                             if grouped["single"] else "")
                 + "".join(f" {v.label}{absolute_gap(variants, v, first)}." for v in ordered.values()
                           if absolute_gap(variants, v, first)))
    return lines + probe_findings(c) + method_findings(c) + claim_findings(c) + paper_findings(c)


def probe_findings(c: Comparison) -> list[str]:
    offsets, trained = c.probe_offsets, c.trained
    if not offsets:
        return []
    invariant, moved = [], []
    for variant in c.variants.values():
        base = variant.probe_estimate(0)
        if base is None:
            continue
        changes = [variant.probe_estimate(offset) for offset in offsets[1:]]
        if any(change is None for change in changes):
            moved.append(f"{variant.label} (no number past its table)")
        elif max(abs(change.mean / base.mean - 1) for change in changes) < 1e-3:
            invariant.append(variant.label)
        else:
            shown = ", ".join(f"+{o // trained}L: {change.mean:.1f}" for o, change in zip(offsets[1:], changes))
            moved.append(f"{variant.label} ({base.mean:.1f} at offset 0; {shown})")
    return [f"- Position-shift probe (the same L-token windows with positions offset by "
            f"{', '.join(f'{o // trained}L' for o in offsets[1:])}): unchanged (< 0.1%) for "
            f"{', '.join(invariant) or 'none'}, as a relative encoding must be"
            + ("; changed for " + "; ".join(moved) if moved else "") + "."]


def method_findings(c: Comparison) -> list[str]:
    """Each method other than the RoPE scalings against the same models as trained and under YaRN, paired by seed."""
    variants, trained = c.variants, c.trained
    targets = sorted({n for n in c.lengths if n in (4 * trained, c.longest) and n > trained})
    lines = []
    for variant in variants.values():
        if variant.method in (NONE, "yarn") or "+" not in variant.label:
            continue
        parts = []
        for length in targets:
            for name, baseline in (("plain", variants.get(variant.encoding)),
                                   ("yarn", variants.get(label(variant.encoding, "yarn")))):
                change = variant.change(baseline, length) if baseline not in (None, variant) else None
                if change is not None:
                    parts.append(f"{length / trained:g}x vs {name}: {change.format(3)}x perplexity, {ratio_word(change)}")
        if parts:
            lines.append(f"  - {variant.label}: " + "; ".join(parts) + ".")
    if not lines:
        return []
    return ["- Inference-time methods against the same trained models as trained (plain) and under YaRN, as a "
            "perplexity ratio paired by seed (< 1: the method helps; 'better' / 'worse' where the 95% interval "
            "excludes 1, 'the same within 1%' where it lies within +-1%, else 'within noise'):", *lines]


def claim_findings(c: Comparison) -> list[str]:
    """The newer encodings' papers' claims (experiments/published/encoding_claims.toml) that this comparison tests."""
    variants, lines = c.variants, []
    for claim in published("encoding_claims"):
        name, baseline = claim["variant"], claim["baseline"]
        if name not in variants or baseline not in variants:
            continue
        if claim["where"] == "1x":
            change = variants[name].change(variants[baseline], min(c.lengths))
            if change is None or change.low is None:
                continue
            evidence = f"{name} / {baseline} perplexity at 1x = {change.format(3)}x"
            outcome = ratio_claim(change, claim["expected"])
        else:
            mine, theirs = variants[name].penalty_estimate(c.longest), variants[baseline].penalty_estimate(c.longest)
            difference = variants[name].penalty_difference(variants[baseline], c.longest)
            if mine is None or theirs is None or difference is None or not difference.has_interval:
                continue
            change = variants[name].change(variants[baseline], c.longest)
            evidence = (f"penalty at {c.longest / c.trained:g}x {name} {mine.format(3, True)} vs {baseline} "
                        f"{theirs.format(3, True)} nats, difference paired by seed and window "
                        f"{difference.format(3, True)}" + (f"; perplexity ratio paired by seed {change.format(3)}x"
                                                          if change is not None and change.low is not None else ""))
            outcome = penalty_claim(difference, claim["expected"])
        lines.append(f"  - {claim['text']}: {evidence}; {outcome}.")
    return ["- Claims of the newer encodings' papers, tested here (95% intervals):", *lines] if lines else []


def paper_findings(c: Comparison) -> list[str]:
    """The ALiBi paper's claims (experiments/published/alibi_paper.toml) on this comparison's models."""
    variants, trained, first, longest = c.variants, c.trained, min(c.lengths), c.longest
    entries = published("alibi_paper")
    lines = ["- Against the ALiBi paper (Press et al. 2022; WikiText-103, 247M parameters, L = 512) (the paper reports "
             "nonoverlapping perplexity, so these use the ratio to each model's own 1x perplexity, per seed, with a t "
             "interval):"]
    for claim in (e for e in entries if "threshold" in e):
        name = claim["variant"]
        length = longest if claim["at"] == "longest" else resolve_length(claim["at"], trained)
        variant = variants.get(name)
        estimate = variant.ratio(length, first) if variant and length in c.lengths else None
        shown = f" ({name} at {length / trained:g}x = {estimate.format(2)}x its 1x perplexity)" if estimate else ""
        text = claim["text"].format(longest=f"{longest / trained:g}x")
        lines.append(f"  - {text}: {threshold_claim(estimate, claim['threshold'], claim['above'])}{shown}"
                     f"{absolute_gap(variants, variant, first) if variant else ''}.")
    order = next(e for e in entries if "text" in e and "variants" in e and "threshold" not in e and "values" not in e)
    present = [n for n in order["variants"] if n in variants and variants[n].penalty_estimate(longest)]
    if len(present) >= 2:
        parts = []
        for worse, better in zip(present, present[1:]):
            a, b = variants[worse].penalty_estimate(longest), variants[better].penalty_estimate(longest)
            difference = variants[worse].penalty_difference(variants[better], longest)
            word = ("undetermined (no interval)" if difference is None or not difference.has_interval else
                    "agrees" if difference.low > 0 else "reversed" if difference.high < 0 else "within noise")
            shown = f", difference {difference.format(3, signed=True)}" if difference is not None else ""
            parts.append(f"{worse} ({a.mean:+.3f}) > {better} ({b.mean:+.3f}{shown}): {word}")
        gaps = "".join(f" {n}{absolute_gap(variants, variants[n], first)}." for n in present
                       if absolute_gap(variants, variants[n], first))
        lines.append(f"  - the order of degradation beyond L ({order['text']}), by the penalty at "
                     f"{longest / trained:g}x: " + "; ".join(parts) + "." + gaps)
    level = next(e for e in entries if "values" in e)
    (a_name, b_name), (a_paper, b_paper) = level["variants"], level["values"]
    a, b = variants.get(a_name), variants.get(b_name)
    if a and b and a.ppl(first) and b.ppl(first):
        ratio = a.ppl(first).mean / b.ppl(first).mean
        line = (f"  - sinusoidal equals rotary at 1x (paper: {a_paper} vs {b_paper}): here {a.ppl(first).mean:.1f}"
                f" vs {b.ppl(first).mean:.1f}, a ratio of {ratio:.3f} "
                f"({'within' if abs(ratio - 1) <= 0.10 else 'not within'} 10%; the difference paired by seed "
                f"{'differs from' if differs(a.nll_difference(b, first)) else 'is within noise of'} 0)")
        shifted = a.probe_estimate(trained)
        if shifted and a.probe_estimate(0):
            line += (f". The shift probe shows the sinusoidal model relies on absolute positions: the same windows "
                     f"score {shifted.mean / a.probe_estimate(0).mean - 1:+.0%} perplexity when only their "
                     "positions move by L")
        lines.append(line + ".")
    return lines


def snapshot_findings(c: Comparison) -> list[str]:
    moves = [f"{name} {rows[0][1].mean:+.3f} -> {rows[-1][1].mean:+.3f} ({movement(rows[0][1], rows[-1][1])})"
             for name, rows in c.snapshots.items() if len(rows) >= 2]
    if not moves:
        return []
    first = next(iter(c.snapshots.values()))[0][0]
    return [f"- Penalty at {c.longest / c.trained:g}x from the model kept at {first:g} of the "
            f"{c.max_steps * c.tokens_per_step:,}-token budget to the final one: " + "; ".join(moves) + "."]


# -------------------------------------------------------------------------------------------------- the map

@dataclass
class MapPoint:
    label: str
    encoding: str
    method: str
    harm: Estimate | None  # text penalty at the longest length
    text_window: Estimate | None = None  # the loss at the longest length less its window control's (paired)
    use: dict[str, Estimate] = field(default_factory=dict)  # lookup task -> exact match at its use cell
    control: dict[str, Estimate] = field(default_factory=dict)
    difference: dict[str, Estimate] = field(default_factory=dict)
    text: UseSummary | None = None
    text_distance: int = 0
    trained: int = 0

    @property
    def text_use(self) -> Estimate | None:
        found = self.text.at(self.text_distance) if self.text else None
        return found[0] if found else None

    @property
    def verdict(self) -> str:
        if self.text is not None:
            uses = any(v == "uses" for d, v in zip(self.text.distances, self.text.verdicts) if d > self.trained)
            return map_reading(self.harm, uses, self.text.positive(self.trained))
        uses = any(d.has_interval and d.low > 0 for d in self.difference.values())
        return map_reading(self.harm, uses, None, measured=bool(self.difference))


def map_points(c: Comparison) -> list[MapPoint]:
    grids = tasks.retrieval_grids(c.task_records)
    points = []
    for name, variant in c.variants.items():
        if WINDOW_CONTROL in variant.method.split("+"):
            continue
        point = MapPoint(name, variant.encoding, variant.method, variant.penalty_estimate(c.longest),
                         text=c.use.get(name), text_distance=TEXT_USE_DISTANCE * c.trained, trained=c.trained)
        window = c.variants.get(name + "+" + WINDOW_CONTROL if variant.method != NONE else
                                f"{variant.encoding}+{WINDOW_CONTROL}")
        if window is not None:
            point.text_window = variant.nll_difference(window, c.longest)
        for task, by_label in grids.items():
            if name in by_label:
                point.use[task], point.control[task], point.difference[task] = by_label[name]
        if point.harm is not None or point.use or point.text is not None:
            points.append(point)
    return points


def map_section(c: Comparison) -> list[str]:
    found = tasks.retrieval_grids(c.task_records)
    lookup_tasks = list(found)
    if not lookup_tasks and not c.use:
        return []
    points, multiple = map_points(c), c.longest / c.trained
    if not plot_map(points, lookup_tasks, multiple, c.out / "map.png", c.settings.use_margin):
        return []
    text = ("Use (y, first panel): the same text models' use of passages repeated "
            f"{TEXT_USE_DISTANCE}L = {TEXT_USE_DISTANCE * c.trained:,} tokens back at the longest length "
            "(eval/use.py; the table gives how far back use holds). " if c.use else "")
    lookup = (f"Lookup panels: capacity on a synthetic lookup in separately trained task models, {tasks.MAP_CELL}, "
              "beside the same task weights with attention limited to the last L keys (the window control, grey "
              "band); stacked layers let that control reach n_layers x (L - 1) tokens back through relays. "
              if lookup_tasks else "")
    columns = [f"text penalty at {multiple:g}x", "text: full - window"]
    if c.use:
        columns += [f"text use {TEXT_USE_DISTANCE}L back (nats)", "how far back (same weights)"]
    for task in lookup_tasks:
        columns += [f"{task} exact match: model", f"{task} exact match: window control",
                    f"{task} exact match: model - control (paired)"]
    if lookup_tasks:
        columns.append("lookup (separate task models)")
    rows = ["| variant | " + " | ".join(columns) + " | reading |", "|---|" + "---:|" * len(columns) + "---|"]
    for p in points:
        cells = [cell(p.harm, 3, signed=True), cell(p.text_window, 3, signed=True)]
        if c.use:
            cells += [cell(p.text_use, 3, signed=True), p.text.reads_back_words(p.trained) if p.text else "n/a"]
        for task in lookup_tasks:
            cells += [cell(p.use.get(task)), cell(p.control.get(task)), cell(p.difference.get(task), signed=True)]
        if lookup_tasks:
            cells.append("n/a" if not p.difference else "beats its window" if any(
                d.has_interval and d.low > 0 for d in p.difference.values()) else "does not beat its window")
        rows.append(f"| {p.label} | " + " | ".join(cells) + f" | {p.verdict} |")
    return ["### The extrapolation map: harm against use", "",
            "Harm (x): the text penalty at the longest length, loss past L less the same tokens' loss under an "
            "L-token window; 0 is what a model that ignores everything past L also scores. " + text + lookup +
            "An encoding extrapolates only where it uses what lies past L while it stays flat on text; flat on text "
            "without that is window-like.", "", "![the extrapolation map](map.png)", "", *rows, "",
            *map_findings(points), ""]


def map_findings(points: list[MapPoint]) -> list[str]:
    if not any(p.difference or p.text is not None for p in points):
        return []
    groups: dict[str, list[str]] = {}
    for point in points:
        groups.setdefault(point.verdict, []).append(point.label)
    shown = [f"{reading}: {', '.join(groups[reading])}" for reading in MAP_ORDER if reading in groups]
    shown += [f"{reading}: {', '.join(labels)}" for reading, labels in groups.items() if reading not in MAP_ORDER]
    if any(p.text is not None for p in points):
        return ["- The extrapolation map on the same weights (use: the text models' own repeated passages; harm: "
                "their text penalty at the longest length): " + "; ".join(shown) + ". 'Extrapolates' needs both: "
                "no harm on text and use of the text past L shown by the one rule (use shown above the margin, Holm over "
                "the report's cells); how far back each reads is the largest distance at which it and every nearer "
                "one read 'uses'."]
    return ["- The extrapolation map, each variant against its own window control (" + tasks.MAP_CELL +
            "; text penalty at the longest length): " + "; ".join(shown) + ". 'Extrapolates' needs both: no harm on "
            "text and a retrieval score above the same weights' window control, paired by seed."]


def plot_map(points: list[MapPoint], lookup_tasks: list[str], multiple: float, path: Path, margin: float) -> bool:
    text = any(p.text_use is not None for p in points)
    shown = [task for task in lookup_tasks if any(task in p.use for p in points)]
    if not text and not shown:
        return False
    names = (["text"] if text else []) + shown
    figure, axes = figures.new(columns=len(names), width=5.2 * len(names) + 1.8, height=4.6)
    axes = list(axes) if len(names) > 1 else [axes]
    for axis, panel in zip(axes, names):
        anchors = []
        controls = [p.control[panel] for p in points if panel in p.control and p.control[panel].has_interval]
        if controls:
            axis.axhspan(max(0.0, min(e.low for e in controls)), max(e.high for e in controls), color="tab:blue",
                         alpha=0.15, linewidth=0, label="window controls (95%)")
        axis.axvspan(-FLAT, FLAT, color="grey", alpha=0.12, linewidth=0, hatch="..", label="flat on text (±0.01)")
        for point in points:
            use, harm = (point.text_use if panel == "text" else point.use.get(panel)), point.harm
            if use is None or harm is None:
                continue
            style = figures.style(point.encoding, point.method)
            axis.errorbar(harm.mean, use.mean, xerr=[[harm.mean - harm.low], [harm.high - harm.mean]]
                          if harm.has_interval else None, yerr=[[use.mean - use.low], [use.high - use.mean]]
                          if use.has_interval else None, color=style["color"], marker=style["marker"], markersize=6,
                          capsize=2, linewidth=1, linestyle="none",
                          markerfacecolor="white" if point.method != NONE else style["color"], label=point.label)
            anchors.append((harm.mean, use.mean, point.label))
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_xlabel(f"harm: text penalty at {multiple:g}x (nats)")
        if panel == "text":
            axis.axhline(0, color="black", linewidth=0.8)
            axis.axhspan(-margin, margin, color="tab:blue", alpha=0.10, linewidth=0,
                         label=f"no use: the equivalence margin (±{margin:g} nats)")
            axis.set_ylabel(f"use of text {TEXT_USE_DISTANCE}L back, same weights (nats, 95% t)")
            axis.set_title(f"the text models: harm against use of passages {TEXT_USE_DISTANCE}L back", fontsize=9)
        else:
            axis.set_ylim(-0.03, 1.03)
            axis.set_ylabel("exact match past L, separate task models")
            axis.set_title(f"capacity on a synthetic lookup ({panel}, separate task models):\n{tasks.MAP_CELL}",
                           fontsize=9)
        axis.grid(True, alpha=0.3)
        figures.place_labels(axis, anchors)
    figures.save(figure, path, axes[-1])
    return True


# ------------------------------------------------------------------------------------------ beyond perplexity

def use_section(c: Comparison) -> list[str]:
    summaries, trained, length = c.use, c.trained, c.longest
    if not summaries:
        return []
    widest = max(summaries.values(), key=lambda s: len(s.distances))
    columns = list(zip(widest.lengths, widest.distances))
    lines = ["### Use of the text past L, on the same weights", "",
             "Repeated passages in held-out windows (eval/use.py): each second copy d tokens after its first, against "
             "the same window with other text in place of the first copies; use = the control's NLL minus the "
             "probe's on the second copies (tokens 2..S), nats, mean [95% t over seeds and windows]. Verdicts "
             "(eval/verdicts.py): the cells past the positive control are one family, each against its variant's "
             f"margin (a tenth of its positive control's use, at least {c.settings.use_margin:g} nats); {USE_RULE}. "
             "How far back: the "
             "largest distance at which it and every nearer one read 'uses'. The longest distance's first copies lie "
             "at the window's start in every window: where the distances hold \"max\" that column is shown and not "
             f"counted in how far back. Windows of L = {trained} tokens (the model as trained, every position one it "
             f"trained at) give the positive control; windows of {length:,} tokens give use past L, as trained and "
             "under each method.", "",
             "| variant | " + " | ".join(f"d = {d:,} ({d / trained:.3g}L) in {n:,}" for n, d in columns)
             + " | how far back |", "|---|" + "---:|" * len(columns) + "---|"]
    for name, summary in summaries.items():
        found = dict(zip(zip(summary.lengths, summary.distances), zip(summary.estimates, summary.verdicts)))
        cells = [f"{cell(found[k][0], 3, signed=True)} {found[k][1]}" if k in found else "n/a" for k in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {summary.reads_back_words(trained)} |")
    checks = [] if not any(widest.across) else [
        "Copies in different documents (a document's end between them; the same windows for every variant): "
        + ", ".join(f"d = {d:,} in {n:,}: {k[0]} of {k[1]}" for (n, d), k in zip(columns, widest.across) if k)
        + ". Use across a document's end is reading the previous document, which a model trained on packed "
          "documents does less (docs/evaluation.md)."]
    failed = [n for n, s in summaries.items() if s.positive(trained) is False]
    passed = [n for n, s in summaries.items() if s.positive(trained)]
    checks.append(f"Positive control (use within L in windows of L): passes for {', '.join(passed) or 'no variant'}"
                  + (f"; FAILS for {', '.join(failed)}: within L their copying is not shown above the margin "
                     f"({c.settings.use_margin:g} nats), so their columns past L cannot show use" if failed else "")
                  + ".")
    for name, summary in summaries.items():
        if summary.reach is not None:
            relay, span = relay_reach(summary.reach, c.layers), default_span(trained)
            beyond = [(summary.distances[i], summary.verdicts[i]) for i in summary.longest_columns()
                      if impossible_use(summary.distances[i], summary.reach, c.layers, span)]
            checks.append(f"Negative control ({name}, attention limited to {summary.reach} keys, which its {c.layers} "
                          f"layers can relay about {relay:,} tokens back): past that and a passage ({span} tokens), "
                          + (", ".join(f"d = {d:,} {v}" for d, v in beyond) or "no distance measured")
                          + f" ({negative_word(v for _, v in beyond)}).")
    rows = [f"| {name} | {s.distances[i]:,} ({s.distances[i] / trained:.3g}L) in {n:,} | "
            f"{cell(s.estimates[i], 3, signed=True)} {s.verdicts[i]} | {cell(s.presence[i], 3, signed=True)} | "
            f"{cell(s.order[i], 3, signed=True)} |" for name, s in summaries.items() for i, n in enumerate(s.lengths)
            if i < len(s.presence) and s.presence[i] is not None]
    priming = [] if not rows else [
        "In order or merely present (the priming control: each first copy holds its passage's tokens shuffled; "
        "presence = NLL(control) - NLL(shuffled), order = NLL(shuffled) - NLL(probe) = use - presence; mean [95% t "
        "over seeds and windows]). A use that is presence is priming, not reading; within L (windows of L) it says "
        "how much of the positive control is copying in order.", "",
        "| variant | distance | use | presence | order |", "|---|---:|---:|---:|---:|", *rows, ""]
    return lines + [""] + [f"- {check}" for check in checks] + [""] + priming


def budget_columns(summary: UseSummary, trained: int) -> dict[str, int]:
    """Use against the tokens trained: the positive control's farthest distance within L, then each multiple of L
    back at the longest length: title -> column."""
    shortest, longest = min(summary.lengths), max(summary.lengths)
    within = [i for i, n in enumerate(summary.lengths) if n == shortest < longest and summary.distances[i] < trained]
    columns = {} if not within else {"within L": max(within, key=lambda i: summary.distances[i])}
    for multiple in BUDGET_MULTIPLES:
        found = [i for i, n in enumerate(summary.lengths) if n == longest and summary.distances[i] == multiple * trained]
        if found:
            columns[f"{multiple}L back"] = found[0]
    return columns


def budget_section(c: Comparison) -> list[str]:
    by_step, trained = c.use_by_step, c.trained
    if len(by_step) < 2:
        return []
    penalties = {name: {round(f * c.max_steps): p for f, p, _, _ in rows} for name, rows in c.snapshots.items()}
    titles = ["within L", *(f"{m}L back" for m in BUDGET_MULTIPLES)]
    multiple = f"{c.longest // trained}x"
    primed = any(any(p is not None for p in s.presence) for summaries in by_step.values() for s in summaries.values())
    lines = ["### Use against the tokens trained", "",
             "The use probe above on every model kept during training (compare.snapshots) and on the final one, on "
             "the same held-out windows: use within L (the positive control, its farthest distance within L) and "
             "2L, 4L and 8L back at the longest length, nats, mean [95% t over seeds and windows], with the "
             "calibrated verdict (Holm over each model's cells, margin a tenth of its own use within L); beside "
             f"them the same model's {multiple} penalty (nats over its L-window reference, 95% t over seeds and "
             "windows; n/a: a window control, or a variant compare.snapshot_methods leaves out).", "",
             *(["Order within L: the part of the within-L use that reading the copy in order adds over its shuffled "
                "tokens (the priming control), the same windows.", ""] if primed else []),
             "| variant | tokens trained | " + " | ".join(titles) + (" | order within L" if primed else "")
             + f" | {multiple} penalty |", "|---|---:|" + "---:|" * (len(titles) + 1 + primed)]
    for name in dict.fromkeys(n for summaries in by_step.values() for n in summaries):
        for step in sorted(by_step):
            summary = by_step[step].get(name)
            if summary is None:
                continue
            found = budget_columns(summary, trained)
            cells = [f"{cell(summary.estimates[found[t]], 3, signed=True)} {summary.verdicts[found[t]]}"
                     if t in found else "n/a" for t in titles]
            if primed:
                index = found.get("within L")
                order = summary.order[index] if index is not None and index < len(summary.order) else None
                cells.append("n/a" if order is None else cell(order, 3, signed=True))
            penalty = penalties.get(name, {}).get(step)
            cells.append("n/a" if penalty is None else cell(penalty, 3, signed=True))
            lines.append(f"| {name} | {step * c.tokens_per_step:,} | " + " | ".join(cells) + " |")
    plot_use_budget(c, primed)
    return lines + ["", "![use against the tokens trained](use_budget.png)", ""]


def plot_use_budget(c: Comparison, primed: bool) -> None:
    titles = ["within L", *(["order within L"] if primed else []), "2L back", "4L back"]
    figure, axes = figures.new(len(titles), width=5 * len(titles), height=4.2)
    names = list(dict.fromkeys(n for s in c.use_by_step.values() for n in s if not n.endswith(f"+{WINDOW_CONTROL}")))
    for axis, title in zip(axes, titles):
        lines = []
        for name in names:
            points = []
            for step in sorted(c.use_by_step):
                summary = c.use_by_step[step].get(name)
                found = budget_columns(summary, c.trained) if summary else {}
                if title == "order within L":
                    index = found.get("within L")
                    estimate = summary.order[index] if index is not None and index < len(summary.order) else None
                else:
                    estimate = summary.estimates[found[title]] if title in found else None
                points.append((step * c.tokens_per_step / 1e6, estimate))
            encoding = name.split("+")[0]
            lines.append((name, {"marker": figures.marker(encoding), "color": colour(encoding), "linestyle":
                                 figures.method_style(name.split("+", 1)[1] if "+" in name else NONE)}, points))
        bars(axis, lines)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_title(f"{title} (L = {c.trained})" if title.startswith("order") else f"use {title} (L = {c.trained})",
                       fontsize=10)
        axis.set_xlabel("training tokens (millions)")
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("use (nats, 95% t over seeds and windows)")
    figure.suptitle("Use of a repeated passage against the tokens trained (models kept during training)")
    figures.save(figure, c.out / "use_budget.png", axes[0], below=True)


def _by_length(found: dict[str, list], lengths: list[str], value) -> list[str]:
    return [f"| {encoding} | " + " | ".join(value(rows, item) for item in lengths) + " |"
            for encoding, rows in found.items()]


def attention_section(c: Comparison) -> list[str]:
    found, settings, trained = c.probe_records("attention"), c.settings, c.trained
    if not found:
        return []
    lines = ["### Attention diagnostics", "",
             f"Per layer and head on {settings.probe_tokens:,} held-out tokens per length "
             "(eval/attention_diagnostics.py), averaged over layers, heads and query positions, mean [95% t interval] "
             "over seeds. Entropy in nats; 'rise': the mean at positions >= L minus the mean at positions < L in the "
             "same windows; 'uniform rise': the same for attention spread evenly over the prefix (mean ln(i + 1)), "
             "the rise that more keys alone cause; far: the share on keys more than L back; sink: the share on the "
             "first 4 tokens.", "",
             *header("encoding @ length", ["entropy < L", "entropy >= L", "entropy rise", "uniform rise",
                                            "distance < L", "distance >= L", "sink share", "far share >= L"])]
    for encoding, rows in found.items():
        for item in settings.probe_lengths:
            s, rise = over_seeds(rows, item), uniform_rise(resolve_length(item, trained), trained)
            lines.append(f"| {encoding} @ {item} | {cell(s['entropy within_L'])} | {cell(s['entropy beyond_L'])} | "
                         f"{cell(s['entropy rise'], signed=True)} | {'n/a' if rise is None else f'{rise:+.2f}'} | "
                         f"{cell(s['distance within_L'], 1)} | {cell(s['distance beyond_L'], 1)} | "
                         f"{cell(s['sink within_L'], 3)} | {cell(s['far beyond_L'], 3)} |")
    lines += ["", "![attention diagnostics](attention.png)", ""]
    longest = max(settings.probe_lengths, key=lambda item: resolve_length(item, trained))
    curves = {encoding: mean_curves(rows, longest) for encoding, rows in found.items()}
    plot_attention({encoding: {"position": encoding, "trained": trained, "lengths": {longest: found}}
                    for encoding, found in curves.items() if found}, c.out)
    length = resolve_length(longest, trained)
    statements = [f"{encoding}: entropy at positions >= L {rise.format(2, True)} nats against < L, penalty "
                  f"{cell(c.variants[encoding].penalty_estimate(length) if encoding in c.variants else None, 3, True)}"
                  " nats" for encoding, rows in found.items() if (rise := over_seeds(rows, longest)["entropy rise"])]
    if statements and length > trained:
        lines += [f"- At {longest}, attention entropy beside the extrapolation penalty: " + "; ".join(statements)
                  + ". A rise well beyond the uniform one with a positive penalty is attention spreading over "
                    "positions it never saw (attention dilution); a flat entropy with a flat penalty is an "
                    "encoding that keeps its attention local.", ""]
    return lines


def induction_section(c: Comparison) -> list[str]:
    found = c.probe_records("induction")
    if not found:
        return []
    block = fleet_block(c.trained)

    def gain(rows: list[dict], item: str) -> str:
        return cell(t_interval([r[item]["gain"]["mean"] for r in rows if "gain" in r.get(item, {})]), signed=True)

    return ["### Induction probe", "",
            f"Sequences of the given length of random tokens whose last {block} repeat their first {block} (the "
            f"copies {block} tokens less than the length apart; {FLEET_TRIALS} trials per length; "
            "eval/induction.py): the loss on the first copy minus the loss on the second, in nats, mean [95% t "
            "interval] over seeds. Near 0: the model does not copy from that far back.", "",
            *header("encoding", list(c.settings.probe_lengths)), *_by_length(found, c.settings.probe_lengths, gain), ""]


def passkey_section(c: Comparison) -> list[str]:
    found = c.probe_records("passkey")
    if not found:
        return []

    def accuracy(rows: list[dict], item: str) -> str:
        per_seed = [r[item] for r in rows if isinstance(r.get(item), list)]
        return cell(seeds_and_trials([sum(round(x["accuracy"] * x["trials"]) for x in seed) for seed in per_seed],
                                     [sum(x["trials"] for x in seed) for seed in per_seed]))

    return ["### Passkey retrieval", "",
            f"{c.settings.passkey_trials} trials per (length, depth) and seed at depths {FLEET_DEPTHS}, pooled over "
            "depths: accuracy, the mean over seeds [95% interval holding the t interval over seeds and the Wilson "
            "interval on all the trials; one seed: Wilson, trials only] (eval/passkey.py, eval/stats.py "
            "seeds_and_trials). Base models are not fine-tuned on the template, so 0 is expected of small ones; "
            "docs/evaluation.md's passkey recipe fine-tunes one.", "",
            *header("encoding", list(c.settings.probe_lengths)),
            *_by_length(found, c.settings.probe_lengths, accuracy), ""]


# ---------------------------------------------------------------------------------------------------- figures

def panel_groups(variants: dict[str, Variant]) -> list[tuple[str, dict[str, Variant]]]:
    """One untitled panel when no variant has a method; else every encoding as trained, then one panel per encoding
    that has methods (as trained, then its methods)."""
    plain = {name: v for name, v in variants.items() if v.method == NONE}
    encodings = list(dict.fromkeys(v.encoding for v in variants.values()))
    with_methods = [e for e in encodings if any(v.encoding == e and v.method != NONE for v in variants.values())]
    if not with_methods:
        return [("", dict(variants))]
    groups = [("every encoding as trained", plain)] if plain else []
    for encoding in with_methods:
        members = {name: v for name, v in variants.items() if v.encoding == encoding}
        groups.append((f"{encoding} under each method", {**{n: v for n, v in members.items() if v.method == NONE},
                                                         **{n: v for n, v in members.items() if v.method != NONE}}))
    return groups


def style(variant: Variant, by_method: bool) -> dict[str, Any]:
    """The encoding's colour, or in a panel of one encoding's methods the method's colour."""
    found = figures.style(variant.encoding, variant.method)
    if by_method:
        found["color"] = figures.method_colour(variant.method)
    return found


def write_figures(c: Comparison) -> None:
    out, trained, groups = c.out, c.trained, panel_groups(c.variants)
    several = len(groups) > 1

    def lines_of(value, xs) -> list[tuple[str, list]]:
        return [(title, [(name, style(v, several and title != "every encoding as trained"),
                          [(x, value(v, x)) for x in xs(v)]) for name, v in members.items()])
                for title, members in groups]

    if c.variants:
        bands(lines_of(lambda v, n: v.ppl(n), lambda v: c.lengths), out / "plot.png",
              "evaluation length (tokens, log scale); dotted = trained length L", "perplexity (log scale)",
              "Perplexity vs evaluation length (mean over seeds, band: 95% t interval)", vline=trained, log_x=True,
              log_y=True)
        bands(lines_of(lambda v, n: v.penalty_estimate(n), lambda v: c.penalty_lengths), out / "penalty.png",
              "evaluation length (tokens, log scale); dotted = trained length L", "extrapolation penalty (nats)",
              "Penalty for positions >= L vs the L-window reference (band: 95% t interval over seeds and windows)",
              vline=trained, log_x=True, zero_line=True)
    if curved(c):
        bucket = max(1, c.longest // 64)
        bands(lines_of(lambda v, x: position_bin(v, int(x // bucket)), lambda v: [
            bucket * (i + 0.5) for i in range(len(next(iter(v.curves.values()))))] if v.curves else []),
              out / "position_loss.png", f"position in a {c.longest}-token window, in bins of {bucket} positions "
              "(each bin: every scored window's tokens there); dotted = L; band: range over seeds",
              "loss in the window minus L-window reference (nats)", "Where a model breaks: per-position penalty at "
              "the longest length (< L: early-token curse)", vline=trained, zero_line=True)
    lines = []
    for encoding in c.settings.encodings:
        for part, curve, look in (("train", "curve", {}), ("validation", "val_curve", {"linestyle": "--", "marker": "o"})):
            points = mean_curve([s[curve] for s in c.training(encoding) if s.get(curve)])
            lines.append((f"{encoding} ({part})", {"color": colour(encoding), **look}, points))
    bands([("", lines)], out / "train_curves.png", "step", "loss (nats/token), mean over seeds; dashed = validation",
          "Training curves (same data, budget, seeds, shape)")
    if c.snapshots:
        figure, axis = figures.new()
        bars(axis, [(name, {"marker": figures.marker(name.split("+")[0]), "color": colour(name.split("+")[0])},
                     [(f * c.max_steps * c.tokens_per_step / 1e6, p) for f, p, _, _ in rows])
                    for name, rows in c.snapshots.items()])
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xlabel("training tokens (millions)")
        axis.set_ylabel(f"extrapolation penalty at {c.longest / trained:g}x (nats, 95% t interval over seeds and "
                        "windows)")
        axis.set_title("Extrapolation against training tokens (models kept during training)", fontsize=10)
        axis.grid(True, alpha=0.3)
        figures.save(figure, out / "snapshots.png", axis)


def mean_curve(curves: list[list]) -> list[tuple[int, Estimate]]:
    """The seeds' training curves: (step, their mean there) along the first seed's steps."""
    return [(step, Estimate(statistics.fmean(c[i][1] for c in curves if i < len(c)), None, None, len(curves)))
            for i, (step, _) in enumerate(curves[0] if curves else [])]


def position_bin(variant: Variant, index: int) -> Estimate:
    """A bin of the penalty by position: the mean over seeds, and their range (no range for one seed)."""
    values = [variant.curves[seed][index] for seed in sorted(variant.curves)]
    mean = float(np.mean(values))
    return Estimate(mean, min(values), max(values), len(values)) if len(values) > 1 else Estimate(mean, None, None, 1)


def curved(c: Comparison) -> bool:
    """Whether the records keep the penalty by position (a migrated study's do not)."""
    return any(v.curves for v in c.variants.values())
