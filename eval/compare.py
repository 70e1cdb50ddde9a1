"""Train one model per position encoding and seed with identical budgets, evaluate them context-matched at
1x..16x the trained context, and write a report with intervals over seeds.

    python -m eval.compare --config configs/compare.toml --preset quick
    python -m eval.compare --config configs/compare.toml --preset full                     # PG-19, from the hub
    python -m eval.compare --config configs/compare.toml --preset full --compare.source=PATH   # local books

Every variant shares the data, token budget, shape and context length L; for each seed in compare.seeds it also
shares the initialisation seed and the data order; only the position settings differ (model.position, or
the model settings of a variant in compare.variants, e.g. a RoPE/NoPE layer hybrid). Each trained model is evaluated
as trained and under each inference-time method in compare.methods that applies to it (eval/methods.py), on the
same held-out tokens at every length, with the L-window reference and the position-shift probe
(eval/extrapolation.py); compare.snapshots also evaluates the models kept at those fractions of training.
Jobs (one per encoding and seed) run in compare.workers processes; each writes OUT/logs/ENCODING-seedS.log.
Re-running skips what is done (trainings resume, evaluations are cached); a job that fails is reported, not
fatal. Writes OUT/report.md, results.json, table.md and the plots (eval/compare_report.py). Optional sections beyond
perplexity: compare.probes (attention diagnostics, the induction probe, passkey retrieval, on every model) and
compare.tasks (the synthetic task suite, trained per encoding); see eval/compare_probes.py.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import hashlib
import json
import multiprocessing
import os
import shlex
import statistics
import sys
import time
import tomllib
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commands import add_out, comma_list, command_parser
from data.batches import PretrainBatches, open_split, read_meta
from data.prepare import prepare
from data.tokenizer import load_tokenizer
from errors import ConfigError, cli_command
from eval.compare_probes import PROBES, run_probes, run_tasks
from eval.compare_report import eval_path, run_dir, write_outputs
from eval.extrapolation import CheckpointEvaluation, evaluate_checkpoint, make_plan, parse_lengths, resolve_length
from eval.jobs import die_with_parent, job_output, share_cores, usable_cores, worker_layout
from eval.methods import applies, check_methods
from eval.task_generators import TASKS
from model.checkpoint import WEIGHTS, has_checkpoint, load_model, load_trainer_state, trained_length
from model.config import build_dataclass, check_field_types
from model.encodings import POSITION_ENCODINGS
from model.folder_lock import FolderLock
from model.runtime import autocast_dtype, configure_runtime, resolve_device
from model.transformer import Transformer
from train.config import RunConfig, build_run_config, parse_override_value, set_dotted
from train.loop import SNAPSHOTS, run_training
from train.trackers import log_summary


@dataclass
class CompareConfig:
    source: str = "stdlib"
    max_documents: int = 0  # hub sources: training documents to stream (0 = the source's own cap)
    vocab_size: int = 4096
    val_fraction: float = 0.05
    encodings: list = field(default_factory=lambda: ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"])
    # Named model variants that compare.encodings may list besides the registered encodings: name -> the model
    # settings that define it, e.g. {p-rope = {position = "rope", position_args = {rope = {p = 0.75}}}}
    # ([compare.variants] in TOML).
    variants: dict = field(default_factory=dict)
    methods: list = field(default_factory=lambda: ["linear", "ntk", "dynamic", "yarn", "clamp"])
    lengths: list = field(default_factory=lambda: ["1x", "2x", "4x", "8x", "16x"])
    eval_tokens: int = 16384
    reference_stride: int = 0  # 0: L / 8
    seeds: list = field(default_factory=lambda: [1337])
    snapshots: list = field(default_factory=list)  # fractions of train.max_steps whose models are also evaluated
    # inference-time methods the snapshots are evaluated under too, where they are among compare.methods and apply
    snapshot_methods: list = field(default_factory=lambda: ["clamp"])
    probes: list = field(default_factory=list)  # of "attention", "induction", "passkey" (eval/compare_probes.py)
    probe_lengths: list = field(default_factory=lambda: ["1x", "4x"])
    probe_tokens: int = 16384  # held-out tokens per length for the attention diagnostics
    passkey_trials: int = 50  # per (length, depth) and seed
    tasks: list = field(default_factory=list)  # synthetic tasks trained per encoding (eval/task_generators.py)
    task_steps: int = 12000  # the cap on each task model's training steps (eval.tasks default)
    task_until: float = 0.95  # stop a task model's training at this validation exact match at L (0: train to the cap)
    workers: int = 0  # 0: one per usable CPU core (one per GPU on CUDA)
    threads: int = 0  # torch threads per worker; 0: CPU cores / workers
    out: str = "runs/compare"

    def __post_init__(self) -> None:
        check_field_types(self, "compare")
        parse_lengths(",".join(self.lengths))
        check_methods(self.methods)
        check_methods(self.snapshot_methods)  # applied where they are also among compare.methods
        for name, settings in self.variants.items():
            if name in POSITION_ENCODINGS or not isinstance(settings, dict) or "position" not in settings:
                raise ConfigError(f"compare.variants.{name}: a variant is a table of model settings that sets "
                                  f"model.position, under a name that is not an encoding's; got {settings!r}")
        valid = sorted(POSITION_ENCODINGS) + sorted(self.variants)
        unknown = [name for name in self.encodings if name not in valid]
        if unknown or not self.encodings:
            raise ConfigError(f"compare.encodings: unknown {unknown}; valid names are the encodings "
                              f"{sorted(POSITION_ENCODINGS)} and the variants {sorted(self.variants)}")
        if len(set(self.encodings)) != len(self.encodings):
            raise ConfigError(f"compare.encodings lists a name twice: {self.encodings}")
        if self.eval_tokens <= 0 or not 0 < self.val_fraction < 1:
            raise ConfigError("compare.eval_tokens must be positive and compare.val_fraction in (0, 1)")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"compare.seeds must be a non-empty list of distinct integers, got {self.seeds}")
        if any(not isinstance(f, (int, float)) or not 0 < f < 1 for f in self.snapshots):
            raise ConfigError(f"compare.snapshots must be fractions of training in (0, 1), got {self.snapshots}")
        unknown = [name for name in self.probes if name not in PROBES] + [n for n in self.tasks if n not in TASKS]
        if unknown:
            raise ConfigError(f"compare.probes / compare.tasks: unknown {unknown}; probes are {sorted(PROBES)}, "
                              f"tasks are {sorted(TASKS)}")
        parse_lengths(",".join(self.probe_lengths))
        if min(self.probe_tokens, self.passkey_trials, self.task_steps) < 1:
            raise ConfigError("compare.probe_tokens, passkey_trials and task_steps must be positive")
        if not 0 <= self.task_until <= 1:
            raise ConfigError(f"compare.task_until is an exact match in [0, 1] (0: off), got {self.task_until}")
        if min(self.workers, self.threads, self.max_documents, self.reference_stride) < 0:
            raise ConfigError("compare.workers, threads, max_documents and reference_stride must be >= 0")


    def model_settings(self, name: str, shared: dict | None = None) -> dict[str, Any]:
        """The model settings that make `name` (an encoding or a variant) differ from the shared [model] settings
        `shared`: a variant's own, and the position_args of the encodings it uses, from `shared` and then from the
        variant (an encoding's settings in the shared [model] reach the runs of that encoding only)."""
        own = copy.deepcopy(self.variants.get(name, {"position": name}))
        shared = shared or {}
        args = copy.deepcopy(shared.get("position_args", {}))
        for encoding, settings in own.pop("position_args", {}).items():
            args[encoding] = {**args.get(encoding, {}), **settings}
        used = set(own.get("position_layers", shared.get("position_layers")) or []) | {own["position"]}
        args = {encoding: settings for encoding, settings in args.items() if encoding in used}
        return {**own, "position_args": args} if args else own

    def position_of(self, name: str) -> str:
        return self.model_settings(name)["position"]


def load_compare_config(path: Path, preset: str | None, overrides: list[str]) -> tuple[CompareConfig, dict, str]:
    """The compare settings, the shared [model]/[train] values for every variant, and the preset used."""
    if not path.exists():
        raise ConfigError(f"config file {path} not found")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML ({error})") from error
    presets = values.pop("presets", {})
    if preset is not None:
        if preset not in presets:
            raise ConfigError(f"--preset {preset!r} is not in {path}; available: {sorted(presets)}")
        for dotted, value in presets[preset].items():
            set_dotted(values, dotted, value, f"{path} [presets.{preset}]")
    for override in overrides:
        if not override.startswith("--") or "=" not in override:
            raise ConfigError(f"override {override!r} must look like --section.key=value")
        dotted, text = override[2:].split("=", 1)
        value = parse_override_value(text)
        if dotted.startswith("compare.") and isinstance(value, (str, int, float)) and not isinstance(value, bool) \
                and isinstance(getattr(CompareConfig(), dotted.split(".", 1)[1], None), list):
            value = [parse_override_value(item) for item in comma_list(str(text))]  # --compare.seeds=1,2,3
        set_dotted(values, dotted, value, "override")
    compare_values = values.pop("compare", {})
    compare = build_dataclass(CompareConfig, {key: value for key, value in compare_values.items()
                                              if key != "encoding_settings"}, "compare")
    for section in ("data", "out"):
        if section in values:
            raise ConfigError(f"{path}: [{section}] is set by eval.compare itself; use [compare] source/out instead")
    if "encoding_settings" in compare_values:
        raise ConfigError("compare.encoding_settings is now [model] position_args: an encoding's settings there "
                          "reach the runs of that encoding only (e.g. \"model.position_args\" = {t5 = {max_distance "
                          "= 64}})")
    for encoding in compare.encodings:  # every variant's config is valid before anything trains
        settings = compare.model_settings(encoding, values.get("model"))
        build_run_config({**copy.deepcopy(values), "model": run_model(values.get("model", {}), settings)},
                         f"{path} ({encoding}: {settings})")
    return compare, values, preset or "default"


def saved_run_config(out: Path) -> dict | None:
    """The settings a run folder was trained with, through today's dataclasses (new keys take their defaults);
    None when it holds no checkpoint or unreadable settings."""
    if not has_checkpoint(out):
        return None
    try:
        return build_run_config(copy.deepcopy(load_trainer_state(out).get("run_config")), str(out),
                                saved=True).to_dict()
    except (ConfigError, TypeError, AttributeError):
        return None


# Where metrics go, and whether the step is compiled: how a run executes, not what it trains (a resumed run may
# change either), so not settings that make runs differ.
EXECUTION = ("report_to", "tracker_group", "compile")


def comparable(settings: dict | None) -> dict | None:
    """A run's settings without those a comparison may add or change on a re-run (EXECUTION)."""
    if settings is None:
        return None
    return {**settings, "train": {k: v for k, v in settings.get("train", {}).items() if k not in EXECUTION}}


def check_existing_runs(configs: dict) -> None:
    """Refuse, before anything trains, an out folder whose runs were trained with other settings (a mixed report
    would compare unlike things)."""
    differing = []
    for (encoding, seed), config in configs.items():
        saved = comparable(saved_run_config(Path(config.out.dir)))
        if saved is not None and saved != comparable(config.to_dict()):
            wanted = comparable(config.to_dict())
            keys = sorted(f"{section}.{key}" for section in wanted for key in wanted[section]
                          if saved.get(section, {}).get(key) != wanted[section][key])
            differing.append(f"{encoding} seed {seed} ({', '.join(keys[:4])})")
    if differing:
        raise ConfigError(f"{Path(next(iter(configs.values())).out.dir).parents[2]} holds a comparison with other "
                          f"settings: {'; '.join(differing[:5])}{' ...' if len(differing) > 5 else ''}; use another "
                          "compare.out, or delete that folder to start over")


def check_existing_data(compare: CompareConfig) -> None:
    """Refuse to prepare the data again (other source, vocabulary or split) under runs trained on the old data."""
    data_dir = Path(compare.out) / "data"
    runs = Path(compare.out) / "runs"
    if not (data_dir / "meta.json").exists() or not any(runs.glob("*/*/" + WEIGHTS)):
        return
    meta = read_meta(data_dir)
    wanted = {"source": compare.source, "val_fraction": compare.val_fraction}
    differ = {key: (meta.get(key), value) for key, value in wanted.items() if meta.get(key) != value}
    if meta.get("vocab_size", 0) > compare.vocab_size:
        differ["vocab_size"] = (meta.get("vocab_size"), compare.vocab_size)
    if differ:
        shown = "; ".join(f"compare.{key}: {old!r} there, {new!r} asked" for key, (old, new) in differ.items())
        raise ConfigError(f"{compare.out} holds a comparison prepared from other data ({shown}); use another "
                          "compare.out, or delete that folder to start over")


def prepared_data(compare: CompareConfig) -> Path:
    """OUT/data, prepared from compare.source unless an identical preparation is already there."""
    data_dir = Path(compare.out) / "data"
    if (data_dir / "meta.json").exists():
        meta = read_meta(data_dir)
        same = (meta.get("source"), meta.get("val_fraction"), meta.get("tokenizer"), meta.get("max_documents")) == (
            compare.source, compare.val_fraction, "trained here", compare.max_documents or meta.get("max_documents"))
        if same and (meta.get("vocab_size") <= compare.vocab_size):
            return data_dir
    prepare(compare.source, data_dir, vocab_size=compare.vocab_size, val_fraction=compare.val_fraction,
            max_documents=compare.max_documents or None)
    return data_dir


@dataclass(frozen=True)
class Job:
    """One encoding and seed: train (or resume, or skip), then evaluate the model and its snapshots."""

    encoding: str
    seed: int
    run_config: dict  # RunConfig.to_dict()
    compare: dict  # CompareConfig as a dict
    threads: int

    @property
    def name(self) -> str:
        return f"{self.encoding}-seed{self.seed}"


def run_model(shared: dict, settings: dict) -> dict:
    """A run's [model]: the shared settings without their position_args, and the run's own settings."""
    return {**{key: value for key, value in copy.deepcopy(shared).items() if key != "position_args"},
            **copy.deepcopy(settings)}


def snapshot_steps(compare: CompareConfig, max_steps: int) -> list[int]:
    return sorted({max(1, round(fraction * max_steps)) for fraction in compare.snapshots})


def variant_config(shared: dict, encoding: str, seed: int, data_dir: Path, compare: CompareConfig) -> RunConfig:
    values = copy.deepcopy(shared)
    values["model"] = run_model(shared.get("model", {}), compare.model_settings(encoding, shared.get("model")))
    values["model"]["vocab_size"] = int(read_meta(data_dir)["vocab_size"])
    values["data"] = {"dir": str(data_dir)}
    values["out"] = {"dir": str(run_dir(compare.out, encoding, seed))}
    train = values.setdefault("train", {})
    train["seed"] = seed
    train["keep_steps"] = snapshot_steps(compare, int(build_run_config(copy.deepcopy(values)).train.max_steps))
    if [name for name in train.get("report_to", []) if name != "jsonl"]:
        train["tracker_group"] = f"compare:{Path(compare.out).name}"  # every variant a run of one group
    return build_run_config(values, f"variant {encoding}, seed {seed}")


def train_variant(config: RunConfig) -> str:
    """Train (or skip, or resume) one variant; returns what happened."""
    out = Path(config.out.dir)
    resume = False
    if has_checkpoint(out):
        state = load_trainer_state(out)
        if comparable(saved_run_config(out)) != comparable(config.to_dict()):
            raise ConfigError(f"{out} holds a run with other settings; delete it or set another compare.out")
        if int(state["step"]) >= config.train.max_steps:
            return "skipped (already trained)"
        resume = True
    batches = PretrainBatches(config.data.dir, config.model.max_seq_len, config.train.batch_size, config.train.seed,
                              config.train.eval_batches)
    run_training(config, lambda: Transformer(config.model), batches, load_tokenizer(config.data.dir), resume=resume,
                 task="compare")
    return "resumed" if resume else "trained"


def extreme_lengths(items: list[str], trained: int) -> list[str]:
    by_length = sorted(items, key=lambda item: resolve_length(item, trained))
    return [by_length[0], by_length[-1]]


def weights_digest(checkpoint: Path) -> str:
    return hashlib.sha256((checkpoint / WEIGHTS).read_bytes()).hexdigest()[:16]


def evaluate_cached(checkpoint: Path, path: Path, compare: CompareConfig, methods: list[str], probe: bool,
                    lengths: list[str] | None = None) -> str:
    """Evaluate `checkpoint` into `path` unless an evaluation of the same weights under the same plan is there."""
    ids = np.asarray(open_split(Path(compare.out) / "data", "val").tokens)
    device = resolve_device("auto")
    model = load_model(checkpoint, device)
    trained = trained_length(checkpoint)
    plan = make_plan(len(ids), trained, lengths or compare.lengths, compare.eval_tokens, compare.reference_stride,
                     probe, segment_lengths=compare.lengths)
    key = {**plan.key(), "weights": weights_digest(checkpoint), "methods": sorted(methods)}
    if path.exists():
        try:
            if CheckpointEvaluation.load(path).plan == key:
                return "cached"
        except (OSError, ValueError, KeyError):
            pass  # an unreadable cache is recomputed
    evaluation = evaluate_checkpoint(model, ids, plan, methods, autocast_dtype(device, "float32"))
    evaluation.plan = key
    evaluation.save(path)
    return f"evaluated in {evaluation.seconds:.0f} s"


_PROGRESS: Any = None  # in a worker process: the queue its jobs report their phases on


def report_phase(job: Job, phase: str) -> None:
    """Tell the main process which phase `job` is in (training, evaluating, probing)."""
    if _PROGRESS is not None:
        _PROGRESS.put((job.name, phase))


def run_job(job: Job, log_path: Path | None = None) -> dict[str, Any]:
    """Train and evaluate one variant; never raises (a failure is returned as its status)."""
    started = time.perf_counter()
    result: dict[str, Any] = {"encoding": job.encoding, "seed": job.seed}
    with job_output(log_path, job.threads):
        try:
            compare = CompareConfig(**job.compare)
            config = build_run_config(copy.deepcopy(job.run_config), f"variant {job.name}")
            configure_runtime(config.runtime)  # the evaluation below too, not just the training
            print(f"=== {job.name} ===", flush=True)
            report_phase(job, "training")
            result["status"] = train_variant(config)
            report_phase(job, "evaluating")
            result["train_s"] = time.perf_counter() - started
            out = Path(config.out.dir)
            steps = [None, *config.train.keep_steps]
            notes = []
            for step in steps:
                checkpoint = out if step is None else out / SNAPSHOTS / f"step-{step:06d}"
                # Snapshots: the model as trained and under compare.snapshot_methods (by default a learned table
                # clamped, its only numbers beyond L), at the shortest and longest lengths (what the snapshot table
                # reports), on the same tokens.
                methods = compare.methods if step is None else [m for m in compare.methods
                                                                if m in compare.snapshot_methods]
                lengths = None if step is None else extreme_lengths(compare.lengths, config.model.max_seq_len)
                notes.append(evaluate_cached(checkpoint, eval_path(compare.out, job.encoding, job.seed, step),
                                             compare, methods, probe=step is None, lengths=lengths))
            result["eval"] = notes[0]
            if compare.probes:
                report_phase(job, "probing")
                ids = np.asarray(open_split(Path(compare.out) / "data", "val").tokens)
                model = load_model(out, resolve_device("auto"))
                probes = run_probes(model, out, ids, config.model.max_seq_len, compare, job.encoding, job.seed,
                                    weights_digest(out))
                result["eval"] += "; probes: " + ", ".join(probes)
        except Exception as error:  # a failed variant is reported, not fatal to the others
            traceback.print_exc()
            result["status"] = f"failed: {type(error).__name__}: {error}".replace("|", "/")[:300]
    result["seconds"] = time.perf_counter() - started
    return result


def _init_worker(slots: Any, progress: Any = None, parent: int | None = None, cores: Any = None) -> None:
    global _PROGRESS
    die_with_parent(parent)
    share_cores(cores)
    _PROGRESS = progress
    index = slots.get()
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())


def largest_first(jobs: list[Job], configs: dict) -> list[Job]:
    """The jobs that evaluate the most models (their own and one per inference-time method that applies: rope's
    four scalings) first, so that no worker idles at the end while the longest job runs alone; otherwise in the
    configured order. Each job is independent: the order changes the wall time only, not a number."""
    def models_evaluated(job: Job) -> int:
        model = configs[(job.encoding, job.seed)].model
        return 1 + sum(applies(method, model.position, model.layer_encodings()) for method in job.compare["methods"])

    return sorted(jobs, key=lambda job: -models_evaluated(job))


def run_jobs(jobs: list[Job], workers: int, out: Path, adapt_threads: bool = False) -> dict[str, dict]:
    """Run the jobs, `workers` at a time (in this process when 1). Prints a line when a job starts a phase
    (training, evaluating, probing) and when it finishes, each with the overall progress and an ETA from the jobs
    that did work (skipped and cached ones take no time). adapt_threads: once fewer jobs are left than workers,
    the running ones take the idle workers' cores for their scoring (eval/jobs.py adopt_free_cores)."""
    global _PROGRESS
    results: dict[str, dict] = {}
    started = time.perf_counter()
    names = {job.name: job for job in jobs}

    def progress() -> str:
        done, elapsed = len(results), time.perf_counter() - started
        worked = [r["seconds"] for r in results.values()
                  if not (str(r["status"]).startswith("skipped") and str(r.get("eval", "")).startswith("cached"))]
        left = (f"about {statistics.fmean(worked) * (len(jobs) - done) / workers / 60:.0f} min left" if worked
                else "no estimate yet")
        return f"{done}/{len(jobs)} done, elapsed {elapsed / 60:.1f} min, {left}"

    def announce(name: str, phase: str) -> None:
        job = names[name]
        print(f"[{progress()}] {job.encoding} seed {job.seed}: {phase}", flush=True)

    def finished(job: Job, result: dict) -> None:
        results[job.name] = result
        print(f"[{progress()}] {job.encoding} seed {job.seed}: {result['status']}"
              f"{', ' + result['eval'] if 'eval' in result else ''} ({result['seconds'] / 60:.1f} min)", flush=True)

    class Printer:  # the progress queue of a single-process run
        def put(self, item: tuple[str, str]) -> None:
            announce(*item)

    if workers == 1:
        _PROGRESS = Printer()
        try:
            for job in jobs:
                finished(job, run_job(job))
        finally:
            _PROGRESS = None
        return results
    context = multiprocessing.get_context("spawn")
    slots, phases, cores = context.Queue(), context.Queue(), context.Value("i", 0)
    for index in range(workers):
        slots.put(index)
    print(f"{len(jobs)} jobs in {workers} worker processes ({jobs[0].threads} thread(s) each); logs in {out / 'logs'}",
          flush=True)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                                                initargs=(slots, phases, os.getpid(), cores)) as pool:
        futures = {pool.submit(run_job, job, out / "logs" / f"{job.name}.log"): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=2, return_when=concurrent.futures.FIRST_COMPLETED)
            while not phases.empty():
                announce(*phases.get())
            for future in done:
                job = futures[future]
                try:
                    result = future.result()
                except Exception as error:  # the worker process itself died
                    result = {"encoding": job.encoding, "seed": job.seed, "seconds": 0.0,
                              "status": f"failed: worker died ({type(error).__name__}: {error})"[:300]}
                finished(job, result)
            if adapt_threads and done and 0 < len(pending) < workers:
                threads = max(jobs[0].threads, usable_cores() // len(pending))
                if threads > max(cores.value, jobs[0].threads):
                    cores.value = threads
                    print(f"[{progress()}] {len(pending)} job(s) left for {workers} workers: each scores with "
                          f"{threads} threads from now on", flush=True)
    return results


def record_invocation(out: Path, command: str, wall_s: float, workers: int, threads: int, results: dict) -> None:
    """Append this invocation to OUT/invocations.jsonl, so a report rebuilt from cache still gives the wall time
    of the invocations that trained and evaluated."""
    statuses = [str(r["status"]).split(" ")[0] for r in results.values()]
    record = {"command": command, "wall_s": round(wall_s, 1), "workers": workers, "threads": threads,
              "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
              "jobs": {status: statuses.count(status) for status in sorted(set(statuses))}}
    with open(out / "invocations.jsonl", "a") as handle:
        handle.write(json.dumps(record) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.compare", __doc__, epilog="Overrides: --compare.key=value (lists comma-separated, "
                                                            "e.g. --compare.encodings=rope,alibi --compare.seeds=1,2), "
                                                            "--model.key=value, --train.key=value")
    parser.add_argument("--config", type=Path, default=Path("configs/compare.toml"), metavar="FILE",
                        help="TOML compare config")
    parser.add_argument("--preset", help="a [presets.NAME] table of the config: quick, newer, full or wikitext103 "
                        "(docs/presets.md: what each answers and costs)")
    add_out(parser, "output folder (default: compare.out of the config)")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parser.parse_known_args(argv)
    command = " ".join(["python -m eval.compare", *map(shlex.quote, (argv if argv is not None else sys.argv[1:]))])
    if args.out:
        overrides.append(f"--compare.out={args.out}")
    started = time.perf_counter()
    compare, shared, preset = load_compare_config(args.config, args.preset, overrides)
    out = Path(compare.out)
    with FolderLock(out, "comparison"):  # one comparison per folder; its trainings lock their own run folders
        return run_comparison(compare, shared, preset, out, command, started)


def run_comparison(compare: CompareConfig, shared: dict, preset: str, out: Path, command: str,
                   started: float) -> int:
    check_existing_data(compare)
    data_dir = prepared_data(compare)
    configs = {(encoding, seed): variant_config(shared, encoding, seed, data_dir, compare)
               for seed in compare.seeds for encoding in compare.encodings}
    check_existing_runs(configs)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    workers, threads = worker_layout(compare.workers, len(configs), gpus, compare.threads)
    jobs = [Job(encoding, seed, config.to_dict(), asdict(compare), threads)
            for (encoding, seed), config in configs.items()]
    results = run_jobs(largest_first(jobs, configs), workers, out, adapt_threads=not compare.threads)
    if compare.tasks:
        try:
            run_tasks(compare, out, shared.get("model", {}))
        except Exception as error:  # the perplexity report is still written
            traceback.print_exc()
            print(f"the task suite failed ({type(error).__name__}: {error}); the report leaves it out",
                  file=sys.stderr)
    wall = time.perf_counter() - started
    record_invocation(out, command, wall, workers, threads, results)
    if all(str(result["status"]).startswith("failed") for result in results.values()) and (out / "report.md").exists():
        print(f"\nevery job failed (see {out / 'logs'}); the previous report in {out} is kept", file=sys.stderr)
        return 1
    write_outputs(out, compare, shared, data_dir, configs, results, command, wall, preset, workers, threads)
    first = next(iter(configs.values())).train
    if [name for name in first.report_to if name != "jsonl"]:
        cells = json.loads((out / "results.json").read_text())["cells"]
        log_summary(first.report_to, out, first.tracker_group, (out / "table.md").read_text(),
                    {f"{c['label']}/ppl_{c['multiple']:g}x": c["ppl"]["mean"] for c in cells if c["ppl"]})
    print(f"\nwrote {out / 'report.md'} ({wall / 60:.1f} min)")
    return 0 if all(not r["status"].startswith("failed") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
