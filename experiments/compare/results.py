"""What a comparison's report, figures and sections read, gathered once into one object: `ComparisonResults`.

It holds the settings (the compare config, the shared [model]/[train] values, every variant's run config), what
the jobs returned, and what the cached evaluations and the runs' logs give: every (encoding, method) variant with
its numbers per length and seed (`Variant`), the snapshot rows and the training summaries. `gather` builds it from
an output folder; experiments/compare/report.py, plots.py and probes.py take it.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from eval.extrapolation import CheckpointEvaluation, resolve_length
from eval.stats import Estimate, t_interval
from experiments.compare.config import CompareConfig, RunConfigs
from experiments.compare.layout import eval_path
from experiments.seed_intervals import perplexity_interval, perplexity_ratio_interval, seeds_and_windows
from model.checkpoint import has_checkpoint, load_trainer_state
from model.methods import NONE, applies, label
from model.transformer import Transformer
from train.config import RunConfig
from train.loop import METRICS

# label -> [(fraction of training, penalty at the longest length, perplexity at 1x, perplexity at the longest)]
SnapshotRow = tuple[float, Estimate, Estimate | None, Estimate | None]
Snapshots = dict[str, list[SnapshotRow]]


@dataclass
class Variant:
    """One row of the report: an encoding (or named variant) as trained or under one inference-time method, with
    its numbers per length and seed."""

    encoding: str
    method: str
    label: str
    nll: dict[int, dict[int, float]] = field(default_factory=dict)  # length -> seed -> nll
    penalty: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # length -> seed -> per-window penalty
    curves: dict[int, np.ndarray] = field(default_factory=dict)  # seed -> penalty by position at the longest length
    probe: dict[int, dict[int, float]] = field(default_factory=dict)  # offset -> seed -> nll
    errors: dict[int, str] = field(default_factory=dict)  # length -> why no number

    def ppl(self, length: int) -> Estimate | None:
        """Perplexity at `length` over seeds: exp of the mean NLL with the t interval of the NLL, exponentiated."""
        return perplexity_interval(list(self.nll.get(length, {}).values()))

    def ratio(self, length: int, base: int) -> Estimate | None:
        """Perplexity at `length` over perplexity at `base`, paired by seed: the t interval of the seeds' NLL
        differences, exponentiated."""
        here, there = self.nll.get(length, {}), self.nll.get(base, {})
        seeds = [s for s in here if s in there]
        return perplexity_ratio_interval([here[s] for s in seeds], [there[s] for s in seeds])

    def penalty_estimate(self, length: int) -> Estimate | None:
        by_seed = self.penalty.get(length, {})
        return seeds_and_windows(np.stack([by_seed[s] for s in sorted(by_seed)])) if by_seed else None

    def nll_difference(self, other: "Variant", length: int) -> Estimate | None:
        """This variant's loss at `length` less `other`'s, in nats, paired by seed (a seed is the same
        initialisation seed and data order for every variant): a t interval over the seeds both have."""
        here, there = self.nll.get(length, {}), other.nll.get(length, {})
        return t_interval([here[seed] - there[seed] for seed in sorted(here) if seed in there])

    def penalty_difference(self, other: "Variant", length: int) -> Estimate | None:
        """This variant's penalty at `length` less `other`'s, paired by seed and by window (the same windows are
        the same text in every model): seeds_and_windows of the differences."""
        here, there = self.penalty.get(length, {}), other.penalty.get(length, {})
        seeds = [seed for seed in sorted(here) if seed in there]
        return seeds_and_windows(np.stack([here[seed] - there[seed] for seed in seeds])) if seeds else None

    def probe_estimate(self, offset: int) -> Estimate | None:
        return perplexity_interval(list(self.probe.get(offset, {}).values()))


def training_summary(run: Path) -> dict[str, Any] | None:
    """What a run's trainer state and metrics say of its training (None without a checkpoint)."""
    if not has_checkpoint(run):
        return None
    state = load_trainer_state(run)
    records = [json.loads(line) for line in (run / METRICS).read_text().splitlines() if line.strip()]
    speeds = [record["tok_per_s"] for record in records if "tok_per_s" in record][1:]  # the first interval warms up
    return {
        "tokens": int(state["tokens_seen"]),
        "wall_s": float(state["elapsed_s"]),
        "tok_per_s": statistics.median(speeds) if speeds else None,
        "val_loss": state.get("val_loss"),
        "initial_val_loss": state.get("initial_val_loss"),
        "curve": [(r["step"], r["loss"]) for r in records if "loss" in r],
        "val_curve": [(r["step"], r["val_loss"]) for r in records if "val_loss" in r],
        "attention_paths": state.get("attention_paths"),  # the path each layer's training forward took
    }


def collect(compare: CompareConfig, configs: RunConfigs, lengths: list[int]) -> dict[str, Variant]:
    """Every (encoding, method) variant with its per-seed numbers, from the cached evaluations (a method is listed
    where it applies to the variant's layers, as evaluate_checkpoint decides)."""
    variants: dict[str, Variant] = {}
    longest = max(lengths)
    for encoding in compare.encodings:
        layers = configs[(encoding, compare.seeds[0])].model.layer_encodings
        methods = [NONE] + [m for m in compare.methods
                            if m != NONE and applies(m, compare.position_of(encoding), layers)]
        for method in methods:
            variants[label(encoding, method)] = Variant(encoding, method, label(encoding, method))
        for seed in compare.seeds:
            path = eval_path(compare.out, encoding, seed)
            if not path.exists():
                continue
            evaluation = CheckpointEvaluation.load(path)
            for method in methods:
                variant = variants[label(encoding, method)]
                for length in lengths:
                    nll = evaluation.nll(method, length)
                    if nll is None:
                        variant.errors[length] = evaluation.errors.get(f"{method}@{length}", "not evaluated")
                        continue
                    variant.nll.setdefault(length, {})[seed] = nll
                    windows = evaluation.penalty_windows(method, length)
                    if windows is not None:
                        variant.penalty.setdefault(length, {})[seed] = windows
                curve = evaluation.position_curve(method, longest)
                if curve is not None:
                    variant.curves[seed] = curve - evaluation.position_curve(method, longest, reference=True)
                for offset in evaluation.plan.get("probe_offsets", []):
                    nll = evaluation.probe_nll(method, offset)
                    if nll is not None:
                        variant.probe.setdefault(offset, {})[seed] = nll
    return {name: variant for name, variant in variants.items() if variant.nll}


def collect_snapshots(compare: CompareConfig, configs: RunConfigs, lengths: list[int]) -> Snapshots:
    """label -> [(fraction, penalty estimate at the longest length, ppl estimates at 1x and at the longest)]: each
    encoding as trained and under each of compare.snapshot_methods that applies to it, where the snapshots have
    numbers at the longest length (a learned table has them only clamped). Empty when no model was kept."""
    first = next(iter(configs.values())).train
    steps, max_steps = first.keep_steps, first.max_steps
    if not steps:
        return {}
    longest, shortest = max(lengths), min(lengths)
    table: Snapshots = {}
    for encoding in compare.encodings:
        layers = configs[(encoding, compare.seeds[0])].model.layer_encodings
        methods = [NONE] + [m for m in compare.snapshot_methods
                            if m != NONE and m in compare.methods and applies(m, compare.position_of(encoding), layers)]
        for method in methods:
            rows = []
            for step in [*steps, None]:
                windows, nll_long, nll_short = [], [], []
                for seed in compare.seeds:
                    path = eval_path(compare.out, encoding, seed, step)
                    if not path.exists():
                        continue
                    evaluation = CheckpointEvaluation.load(path)
                    penalty = evaluation.penalty_windows(method, longest)
                    if penalty is None:
                        continue
                    windows.append(penalty)
                    nll_short.append(evaluation.nll(method, shortest))
                    nll_long.append(evaluation.nll(method, longest))
                if windows:
                    rows.append(((step or max_steps) / max_steps, seeds_and_windows(np.stack(windows)),
                                 perplexity_interval(nll_short), perplexity_interval(nll_long)))
            if rows:
                table[label(encoding, method)] = rows
    return table


@dataclass(frozen=True)
class Invocation:
    """The command that wrote the report, and how it ran."""

    command: str
    wall_s: float
    preset: str
    workers: int
    threads: int
    machine: str  # experiments.jobs.machine_description()


@dataclass
class ComparisonResults:
    """Everything the report, the figures and the probe and task sections read, gathered once (`gather`)."""

    compare: CompareConfig
    shared: dict  # the [model] and [train] values every variant shares (before its own settings)
    configs: RunConfigs
    statuses: dict[str, dict]  # job name (ENCODING-seedS) -> what the job returned
    training: dict[str, dict[int, dict | None]]  # encoding -> seed -> training_summary
    variants: dict[str, Variant]  # label -> variant, those with a number
    snapshots: Snapshots
    invocation: Invocation

    @property
    def out(self) -> Path:
        return Path(self.compare.out)

    @property
    def data_dir(self) -> Path:
        return self.out / "data"

    @property
    def first_config(self) -> RunConfig:
        return next(iter(self.configs.values()))

    @property
    def trained(self) -> int:
        """L: the context length every variant trained at."""
        return self.first_config.model.max_seq_len

    def most_layers(self) -> int:
        """The most layers of any variant: how many hops a window control's relays can have at most."""
        return max(config.model.n_layers for config in self.configs.values())

    @property
    def lengths(self) -> list[int]:
        """The evaluation lengths in tokens, shortest first."""
        return evaluation_lengths(self.compare, self.configs)

    @property
    def longest(self) -> int:
        return max(self.lengths)

    @property
    def penalty_lengths(self) -> list[int]:
        """The lengths beyond L, where the penalty is measured."""
        return [n for n in self.lengths if n > self.trained]

    @property
    def probe_offsets(self) -> list[int]:
        return sorted({offset for v in self.variants.values() for offset in v.probe})

    @property
    def probe_variants(self) -> dict[str, Variant]:
        return {name: v for name, v in self.variants.items() if v.probe}

    @property
    def max_steps(self) -> int:
        return self.first_config.train.max_steps

    @property
    def tokens_per_step(self) -> int:
        train = self.first_config.train
        return train.batch_size * train.grad_accum * self.trained

    @cached_property
    def parameters(self) -> dict[str, int]:
        """encoding -> its model's parameter count."""
        return {e: Transformer(self.configs[(e, self.compare.seeds[0])].model).num_parameters()
                for e in self.compare.encodings}

    def penalty(self, name: str, length: int) -> Estimate | None:
        """The extrapolation penalty of variant `name` at `length` (None where it has none)."""
        return self.variants[name].penalty_estimate(length) if name in self.variants else None


def evaluation_lengths(compare: CompareConfig, configs: RunConfigs) -> list[int]:
    trained = next(iter(configs.values())).model.max_seq_len
    return sorted({resolve_length(item, trained) for item in compare.lengths})


def gather(compare: CompareConfig, shared: dict, configs: RunConfigs, statuses: dict[str, dict],
           invocation: Invocation) -> ComparisonResults:
    """The results of the comparison in compare.out: the cached evaluations of every variant and snapshot, and the
    training summaries of its runs."""
    lengths = evaluation_lengths(compare, configs)
    training = {encoding: {seed: training_summary(Path(configs[(encoding, seed)].out.dir)) for seed in compare.seeds}
                for encoding in compare.encodings}
    return ComparisonResults(compare, shared, configs, statuses, training, collect(compare, configs, lengths),
                             collect_snapshots(compare, configs, lengths), invocation)
