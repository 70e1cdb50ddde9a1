"""Train one model per position encoding and seed with identical budgets, evaluate them context-matched at
1x..16x the trained context, and write a report with intervals over seeds.

    python -m experiments.compare --config configs/compare.toml --preset quick
    python -m experiments.compare --config configs/compare.toml --preset full                     # PG-19, from the hub
    python -m experiments.compare --config configs/compare.toml --preset full --compare.source=PATH   # local books
    python -m experiments.compare --config configs/compare.toml --preset quick --cluster HEAD:6379    # on a Ray cluster

Every variant shares the data, token budget, shape and context length L; for each seed it also shares the
initialisation seed and the data order; only the position settings differ (model.position, or the model settings of
a variant in compare.variants, e.g. a RoPE/NoPE layer hybrid). A cell is one encoding and seed: its model is trained
(or resumed: OUT/work/runs/ENCODING-seedS-KEY, KEY what it trains: its data and run settings), then evaluated as trained and under each inference-time method of
compare.methods that applies to it (model/methods/), on the same held-out tokens at every length, with the L-window
reference and the position-shift probe (eval/extrapolation.py); compare.snapshots also evaluates the models kept at
those fractions of training; compare.probes runs the attention diagnostics, the induction probe, passkey retrieval
and the use of the text past L (eval/use.py) on every model; compare.tasks trains the synthetic tasks per encoding and
seed (experiments/tasks.py), one cell each. The engine (experiments/engine.py) keeps each cell's record, resumes,
and renders OUT/report.md, table.md and the figures (experiments/compare_report.py).
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from data.batches import PretrainBatches, open_split, read_meta
from data.prepare import prepare as prepare_data
from data.tasks import TASKS
from data.tokenizer import ENDOFTEXT, load_tokenizer
from errors import ConfigError
from eval.extrapolation import CheckpointEvaluation, evaluate_checkpoint, make_plan, parse_lengths, resolve_length
from eval.fleet_probes import PROBES
from eval.use import check_fleet_windows, fleet_windows
from experiments import tasks
from experiments.compare_report import report
from experiments.engine import Context, Study, key, option
from model.checkpoint import has_checkpoint, load_model, load_trainer_state
from model.encodings import POSITION_ENCODINGS
from model.fields import check_field_types
from model.methods import NONE, applies, check_methods
from model.recipes import RECIPES, expand
from model.runtime import configure_runtime, resolve_device
from model.transformer import Transformer
from train.config import RunConfig, build_run_config
from train.loop import SNAPSHOTS, Training, run_training
from train.summary import run_summary

PROBE_NAMES = ("attention", "induction", "passkey", "use")
# Where metrics go: how a run reports, not what it trains (left out of a cell's address)
EXECUTION = ("report_to", "tracker_group")
DATA_FACTS = ("train_documents", "train_tokens", "val_documents", "val_tokens", "split", "vocab_size")


@dataclass
class Settings:
    source: str = option("stdlib", "data.prepare source: a named source (stdlib, pg19, ...) or a local path")
    max_documents: int = option(0, "hub sources: training documents to stream (0: the source's own cap)")
    vocab_size: int = option(4096, "BPE vocabulary")
    val_fraction: float = option(0.05, "documents held out for evaluation")
    encodings: list = option(["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"],
                             "encodings and named variants (compare.variants) to train")
    variants: dict = option({}, "name -> model settings of a variant, or {recipe = NAME}")
    train_settings: dict = option({}, "name -> its own [train] settings over the shared ones, e.g. {fox = {lr = 0.01}}")
    methods: list = option(["linear", "ntk", "dynamic", "yarn", "clamp"], "inference-time methods, each where it applies")
    lengths: list = option(["1x", "2x", "4x", "8x", "16x"], "evaluation lengths, multiples of L")
    eval_tokens: int = option(16384, "held-out tokens scored at every length")
    reference_stride: int = option(0, "stride of the L-window reference (0: L / 8)")
    seeds: list = option([1337], "one model per encoding and seed")
    snapshots: list = option([], "fractions of training whose kept models are evaluated too")
    snapshot_methods: list = option(["clamp"], "methods the kept models are evaluated under too")
    probes: list = option([], f"on every model: {', '.join(PROBE_NAMES)}")
    snapshot_probes: list = option([], '["use"]: the use probe on every kept model too')
    probe_lengths: list = option(["1x", "4x"], "lengths of the attention and passkey probes, distances of induction")
    probe_tokens: int = option(16384, "held-out tokens per length for the attention diagnostics")
    passkey_trials: int = option(50, "passkey trials per (length, depth) and seed")
    use_distances: list = option(["0.5x", "2x", "4x", "8x", "max"], "the use probe's distances (the first within L)")
    use_windows: int = option(64, "the use probe's windows per model at the longest length")
    use_margin: float = option(0.05, "the use verdicts' margin floor, nats")
    use_priming: bool = option(False, "the priming control: use split into presence and order")
    tasks: list = option([], f"synthetic tasks trained per encoding and seed: {', '.join(sorted(TASKS))}")
    task_steps: int = option(12000, "the cap on each task model's training steps")
    task_until: float = option(0.95, "stop a task model at this validation exact match at L (0: train to the cap)")
    task_cycle: int = option(0, "the task models' learning-rate cycle and stop check, in steps (0: 3,000)")
    task_count: int = option(256, "fresh test sequences per length")
    workers: int = option(0, "cells at a time (0: one per usable core or GPU); --workers overrides it")
    threads: int = option(0, "torch threads per cell (0: cores / workers); --threads overrides it")
    out: str = option("runs/compare", "the study's folder")
    model: dict = option({}, "[model]: the model settings every variant shares")
    train: dict = option({}, "[train]: the training settings every variant shares")
    runtime: dict = option({}, "[runtime]: how every run computes")

    def __post_init__(self) -> None:
        check_field_types(self, "compare")
        for items in (self.lengths, self.probe_lengths, [d for d in self.use_distances if d != "max"] or ["1x"]):
            parse_lengths(",".join(items))
        check_methods(self.methods)
        check_methods(self.snapshot_methods)
        for name, settings in self.variants.items():
            sound = isinstance(settings, dict) and ("position" in settings) != ("recipe" in settings)
            if name in POSITION_ENCODINGS or not sound or settings.get("recipe", min(RECIPES)) not in RECIPES:
                raise ConfigError(f"compare.variants.{name}: a variant is a table of model settings that sets "
                                  f"model.position, or names a recipe ({sorted(RECIPES)}), under a name that is not "
                                  f"an encoding's; got {repr(settings)}")
        valid = sorted(POSITION_ENCODINGS) + sorted(self.variants)
        unknown = [name for name in [*self.encodings, *self.train_settings] if name not in valid]
        if unknown or not self.encodings or len(set(self.encodings)) != len(self.encodings):
            raise ConfigError(f"compare.encodings / train_settings: unknown or repeated {unknown or self.encodings}; "
                              f"valid names are the encodings {sorted(POSITION_ENCODINGS)} and the variants "
                              f"{sorted(self.variants)}")
        distinct = len(set(self.seeds)) == len(self.seeds)
        if not self.seeds or not distinct or any(not isinstance(s, int) or isinstance(s, bool) for s in self.seeds):
            raise ConfigError(f"compare.seeds must be a non-empty list of distinct integers, got {self.seeds}")
        if any(not isinstance(f, (int, float)) or not 0 < f < 1 for f in self.snapshots):
            raise ConfigError(f"compare.snapshots must be fractions of training in (0, 1), got {self.snapshots}")
        unknown = [n for n in self.probes if n not in PROBE_NAMES] + [n for n in self.tasks if n not in TASKS]
        if unknown or any(n != "use" for n in self.snapshot_probes) or (self.snapshot_probes and not self.snapshots):
            raise ConfigError(f"compare.probes / tasks / snapshot_probes: unknown {unknown or self.snapshot_probes}; "
                              f"probes are {sorted(PROBE_NAMES)}, tasks {sorted(TASKS)}; snapshot_probes = ['use'] "
                              "needs compare.snapshots")
        counts = (self.eval_tokens, self.use_windows, self.probe_tokens, self.passkey_trials, self.task_steps,
                  self.task_count)
        others = (self.workers, self.threads, self.max_documents, self.reference_stride, self.task_cycle)
        if min(counts) < 1 or min(others) < 0 or not (0 < self.val_fraction < 1 and 0 <= self.task_until <= 1) or (
                self.use_margin <= 0):
            raise ConfigError("compare: eval_tokens, use_windows, probe_tokens, passkey_trials, task_steps and "
                              "task_count must be positive, val_fraction in (0, 1), use_margin > 0, task_until in "
                              "[0, 1], and workers, threads, max_documents, reference_stride, task_cycle >= 0")

    def model_settings(self, name: str) -> dict[str, Any]:
        """The model settings that make `name` (an encoding or a variant) differ from the shared [model]: a
        variant's own, and the position_args of the encodings it uses (the shared [model]'s, then its own)."""
        own = copy.deepcopy(expand(self.variants.get(name, {"position": name}), self.model))
        args = copy.deepcopy(self.model.get("position_args", {}))
        for encoding, settings in own.pop("position_args", {}).items():
            args[encoding] = {**args.get(encoding, {}), **settings}
        used = set(own.get("position_layers", self.model.get("position_layers")) or []) | {own["position"]}
        args = {encoding: settings for encoding, settings in args.items() if encoding in used}
        return {**own, "position_args": args} if args else own

    def run_values(self, name: str, seed: int, vocab_size: int) -> dict[str, Any]:
        """The run config of `name` and `seed` (without where its data and run folder lie)."""
        model = {**{k: v for k, v in copy.deepcopy(self.model).items() if k != "position_args"},
                 **self.model_settings(name), "vocab_size": vocab_size}
        train = {**copy.deepcopy(self.train), **copy.deepcopy(self.train_settings.get(name, {})), "seed": seed}
        values = {"model": model, "train": train, "runtime": copy.deepcopy(self.runtime)}
        steps = build_run_config(copy.deepcopy(values), f"variant {name}, seed {seed}").train.max_steps
        train["keep_steps"] = sorted({max(1, round(fraction * steps)) for fraction in self.snapshots})
        return values

    def position_of(self, name: str) -> str:
        return expand(self.variants.get(name, {"position": name}), {"n_layers": 12, "max_seq_len": 1024})["position"]


# ---------------------------------------------------------------------------------------------------- cells

def data_digest(data_dir: Path) -> str:
    """What the prepared data is: the SHA-256 of its tokens and tokenizer (first 16 hex digits)."""
    digest = hashlib.sha256()
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        digest.update((data_dir / name).read_bytes())
    return digest.hexdigest()[:16]


def prepare(settings: Settings, context: Context) -> None:
    """OUT/work/data, prepared from compare.source unless an identical preparation is there; then the checks that
    would otherwise fail after training (the use probe's windows must fit in the held-out text)."""
    data_dir = context.work / "data"
    meta = read_meta(data_dir) if (data_dir / "meta.json").exists() else {}
    same = (meta.get("source"), meta.get("val_fraction"), meta.get("max_documents")) == (
        settings.source, settings.val_fraction, settings.max_documents or meta.get("max_documents"))
    if not (same and meta.get("vocab_size", 1 << 30) <= settings.vocab_size):
        prepare_data(settings.source, data_dir, vocab_size=settings.vocab_size, val_fraction=settings.val_fraction,
                     max_documents=settings.max_documents or None)
    if "use" in (*settings.probes, *settings.snapshot_probes):
        values = settings.run_values(settings.encodings[0], settings.seeds[0], int(read_meta(data_dir)["vocab_size"]))
        trained = build_run_config(values, "compare").model.max_seq_len
        longest = max(resolve_length(item, trained) for item in settings.lengths)
        check_fleet_windows(settings.use_windows, trained, longest, len(open_split(data_dir, "val").tokens))


def cells(settings: Settings, context: Context) -> list[dict]:
    """One cell per encoding and seed (those that evaluate the most models first, so no worker idles at the end),
    then the task cells (experiments/tasks.py)."""
    data_dir = context.work / "data"
    meta = read_meta(data_dir)
    data = {"source": settings.source, "vocab_size": settings.vocab_size, "val_fraction": settings.val_fraction,
            "max_documents": settings.max_documents, "digest": data_digest(data_dir)}
    held_out = len(open_split(data_dir, "val").tokens)
    found = []
    for seed in settings.seeds:
        for name in settings.encodings:
            values = settings.run_values(name, seed, int(meta["vocab_size"]))
            config = build_run_config(copy.deepcopy(values), f"variant {name}, seed {seed}")
            trained, model = config.model.max_seq_len, config.model
            methods = [m for m in settings.methods if applies(m, model.position, model.layer_encodings)]
            longest = max(resolve_length(item, trained) for item in settings.lengths)
            local = {key: values["train"].pop(key) for key in EXECUTION if key in values["train"]}
            if [tracker for tracker in local.get("report_to", []) if tracker != "jsonl"]:
                local["tracker_group"] = f"compare:{Path(settings.out).name}"  # every variant a run of one group
            found.append({
                "name": f"{name}-seed{seed}", "kind": "model", "encoding": name, "seed": seed, "data": data,
                "run": values, "lengths": settings.lengths, "eval_tokens": settings.eval_tokens,
                "reference_stride": settings.reference_stride, "methods": methods,
                "snapshot_methods": [m for m in methods if m in settings.snapshot_methods],
                "probes": settings.probes, "snapshot_probes": settings.snapshot_probes,
                "probe_lengths": settings.probe_lengths, "probe_tokens": settings.probe_tokens,
                "passkey_trials": settings.passkey_trials, "use_distances": settings.use_distances,
                "use_windows": fleet_windows(settings.use_windows, trained, longest, held_out),
                "use_priming": settings.use_priming, "local": {"train": local}})
    found.sort(key=lambda cell: -len(cell["methods"]))
    if settings.tasks:
        found += tasks.comparison_cells(settings)
    return found


# ------------------------------------------------------------------------------------------------- measuring

def measure(cell: dict, context: Context) -> dict:
    if cell["kind"] == "task":
        return tasks.measure(cell, context)
    data_dir = context.work / "data"
    if data_digest(data_dir) != cell["data"]["digest"]:
        raise ConfigError(f"{data_dir} holds other data than this cell was declared on: prepare it again (run the "
                          "study, not a cell) or point every node at the same study folder")
    run = run_folder(context.work, cell)
    values = copy.deepcopy(cell["run"])
    values["train"].update(cell["local"]["train"])
    config = build_run_config({**values, "data": {"dir": str(data_dir)}, "out": {"dir": str(run)}},
                              f"variant {cell['name']}")
    configure_runtime(config.runtime)
    device = resolve_device(context.device)
    status = train(config)
    ids = np.asarray(open_split(data_dir, "val").tokens)
    meta = read_meta(data_dir)
    record: dict[str, Any] = {"status": status, "data": {**{k: meta.get(k) for k in DATA_FACTS},
                                                         "val_names": meta.get("val_names", [])[:12]},
                              "training": run_summary(run, config),
                              "evaluation": evaluate(run, cell, ids, cell["methods"], config, True, device)}
    kept = {step: run / SNAPSHOTS / f"step-{step:06d}" for step in config.train.keep_steps}
    trained = config.model.max_seq_len
    extremes = sorted({resolve_length(item, trained) for item in cell["lengths"]})
    record["snapshots"] = {str(step): evaluate(path, cell, ids, cell["snapshot_methods"], config, False, device,
                                               [f"{extremes[0]}", f"{extremes[-1]}"])
                           for step, path in kept.items()}
    separator = load_tokenizer(run).convert_tokens_to_ids(ENDOFTEXT)
    record["probes"] = {name: PROBES[name](load_model(run, device, config.runtime), run, ids, trained, cell, separator)
                        for name in cell["probes"]}
    record["snapshot_probes"] = {str(step): {"use": PROBES["use"](load_model(path, device, config.runtime), path, ids,
                                                                  trained, cell, separator)}
                                 for step, path in kept.items() if cell["snapshot_probes"]}
    return record


def run_folder(work: Path, cell: dict) -> Path:
    """WORK/runs/NAME-KEY, KEY what the cell trains (its data and run settings, less how it runs: a run resumes under
    another compile setting), so that a cell of other data or settings never takes another's model."""
    return work / "runs" / f"{cell['name']}-{key({'data': cell['data'], 'run': comparable(cell['run'])})}"


def train(config: RunConfig) -> str:
    """Train (or skip, or resume) one variant; returns what happened."""
    out = Path(config.out.dir)
    resume = False
    if has_checkpoint(out):
        state = load_trainer_state(out)
        saved = build_run_config(copy.deepcopy(state.get("run_config")), str(out), saved=True).to_dict()
        if comparable(saved) != comparable(config.to_dict()):
            raise ConfigError(f"{out} holds a run with other settings; delete it or set another compare.out")
        if int(state["step"]) >= config.train.max_steps:
            return "skipped (already trained)"
        resume = True
    batches = PretrainBatches(config.data.dir, config.model.max_seq_len, config.train.batch_size, config.train.seed,
                              config.train.eval_batches)
    run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(config.data.dir),
                          resume=resume, task="compare"))
    return "resumed" if resume else "trained"


def comparable(settings: dict) -> dict:
    """A run's settings without where its data and folder lie (a study folder may move) and those that change how it
    runs, not what it trains (a resumed run may change them)."""
    return {**{k: v for k, v in settings.items() if k not in ("data", "out")},
            "train": {k: v for k, v in settings.get("train", {}).items() if k not in (*EXECUTION, "compile", "fused_loss")}}


def evaluate(checkpoint: Path, cell: dict, ids: np.ndarray, methods: list[str], config: RunConfig, probe: bool,
             device: str, lengths: list[str] | None = None) -> dict[str, Any]:
    """The checkpoint scored at the cell's lengths (or `lengths`) under `methods` (eval/extrapolation.py)."""
    trained = config.model.max_seq_len
    plan = make_plan(len(ids), trained, lengths or cell["lengths"], cell["eval_tokens"], cell["reference_stride"],
                     probe, segment_lengths=cell["lengths"])
    evaluation = evaluate_checkpoint(load_model(checkpoint, device, config.runtime), ids, plan, methods, None)
    evaluation.plan = plan.key()
    return CheckpointEvaluation.summary(evaluation, [NONE, *methods])


STUDY = Study("experiments.compare", Settings, cells, measure, report, prepare, __doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.compare"))
