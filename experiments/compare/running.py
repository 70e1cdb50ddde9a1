"""The comparison's jobs: one per encoding and seed, each trains its model (or resumes, or skips a finished one)
and evaluates it and its snapshots (cached per weights and plan), then runs compare.probes on it. Also what
runs before any job (the data, each variant's run config, refusing an output folder made with other settings)
and after (the record of the invocation).
"""
from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import os
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from data.batches import PretrainBatches, open_split, read_meta
from data.prepare import prepare
from data.tokenizer import load_tokenizer
from errors import ConfigError
from eval.extrapolation import CheckpointEvaluation, evaluate_checkpoint, make_plan, resolve_length
from experiments.compare.config import CompareConfig, RunConfigs, run_model
from experiments.compare.layout import eval_path, record_invocation, run_dir, weights_digest
from experiments.compare.probes import run_probes
from experiments.compare.reuse import reuse_trained
from experiments.jobs import FreeCores, comparable, die_with_parent, job_output, saved_run_config, usable_cores
from model.checkpoint import WEIGHTS, has_checkpoint, load_model, load_trainer_state, trained_length
from model.methods import applies
from model.runtime import autocast_dtype, configure_runtime, resolve_device
from model.runtime_config import RuntimeConfig
from model.transformer import Transformer
from train.config import RunConfig, build_run_config
from train.loop import SNAPSHOTS, Training, run_training


def check_existing_runs(configs: RunConfigs) -> None:
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


def snapshot_steps(compare: CompareConfig, max_steps: int) -> list[int]:
    return sorted({max(1, round(fraction * max_steps)) for fraction in compare.snapshots})


def variant_config(shared: dict, encoding: str, seed: int, data_dir: Path, compare: CompareConfig) -> RunConfig:
    values = copy.deepcopy(shared)
    values["model"] = run_model(shared.get("model", {}), compare.model_settings(encoding, shared.get("model")))
    values["model"]["vocab_size"] = int(read_meta(data_dir)["vocab_size"])
    values["data"] = {"dir": str(data_dir)}
    values["out"] = {"dir": str(run_dir(compare.out, encoding, seed))}
    train = values["train"] = compare.train_of(encoding, shared.get("train"))
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
    run_training(Training(config, lambda: Transformer(config.model), batches, load_tokenizer(config.data.dir), resume=resume,
                 task="compare"))
    return "resumed" if resume else "trained"


def extreme_lengths(items: list[str], trained: int) -> list[str]:
    by_length = sorted(items, key=lambda item: resolve_length(item, trained))
    return [by_length[0], by_length[-1]]


def evaluate_cached(checkpoint: Path, path: Path, compare: CompareConfig, methods: list[str], probe: bool,
                    lengths: list[str] | None = None, runtime: RuntimeConfig | None = None) -> str:
    """Evaluate `checkpoint` into `path` unless an evaluation of the same weights under the same plan is there."""
    ids = np.asarray(open_split(Path(compare.out) / "data", "val").tokens)
    device = resolve_device("auto")
    model = load_model(checkpoint, device, runtime)
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
    evaluation = evaluate_checkpoint(model, ids, plan, methods, autocast_dtype(device, "float32"),
                                     on_batch=_WORKER.free_cores)
    evaluation.plan = key
    evaluation.save(path)
    return f"evaluated in {evaluation.seconds:.0f} s"


@dataclass(frozen=True)
class Worker:
    """What a process that runs jobs was given when it started: the queue its jobs report their phases on, and the
    pool's free cores (None in a single-process run)."""

    progress: Any = None
    free_cores: FreeCores | None = None


# Set once per process, when it starts running jobs: by the pool's initializer in a worker process, by run_jobs
# in a single-process run.
_WORKER = Worker()


def report_phase(job: Job, phase: str) -> None:
    """Tell the main process which phase `job` is in (training, evaluating, probing)."""
    if _WORKER.progress is not None:
        _WORKER.progress.put((job.name, phase))


def run_job(job: Job, log_path: Path | None = None) -> dict[str, Any]:
    """Train and evaluate one variant; never raises (a failure is returned as its status)."""
    started = time.perf_counter()
    result: dict[str, Any] = {"encoding": job.encoding, "seed": job.seed}
    with job_output(log_path, job.threads):
        try:
            compare = CompareConfig(**job.compare)
            config = build_run_config(copy.deepcopy(job.run_config), f"variant {job.name}")
            configure_runtime(config.runtime)  # the process's part; the models below are given config.runtime
            print(f"=== {job.name} ===", flush=True)
            report_phase(job, "training")
            # a model another comparison trained with these settings (compare.reuse), else train it here
            result["status"] = (reuse_trained(config, job.encoding, job.seed, compare.reuse)
                                or train_variant(config))
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
                                             compare, methods, probe=step is None, lengths=lengths,
                                             runtime=config.runtime))
            result["eval"] = notes[0]
            ids = np.asarray(open_split(Path(compare.out) / "data", "val").tokens) \
                if compare.probes or compare.snapshot_probes else None
            if compare.probes:
                report_phase(job, "probing")
                model = load_model(out, resolve_device("auto"), config.runtime)
                probes = run_probes(model, out, ids, config.model.max_seq_len, compare, job.encoding, job.seed)
                result["eval"] += "; probes: " + ", ".join(probes)
            if compare.snapshot_probes:  # the same probe on every kept model: use against the tokens trained
                report_phase(job, "probing snapshots")
                for step in config.train.keep_steps:
                    kept = out / SNAPSHOTS / f"step-{step:06d}"
                    model = load_model(kept, resolve_device("auto"), config.runtime)
                    run_probes(model, kept, ids, config.model.max_seq_len, compare, job.encoding, job.seed, step)
                result["eval"] += f"; snapshot probes at steps {config.train.keep_steps}"
        except Exception as error:  # a failed variant is reported, not fatal to the others
            traceback.print_exc()
            result["status"] = f"failed: {type(error).__name__}: {error}".replace("|", "/")[:300]
    result["seconds"] = time.perf_counter() - started
    return result


def _init_worker(slots: Any, progress: Any = None, parent: int | None = None, cores: Any = None) -> None:
    global _WORKER
    die_with_parent(parent)
    _WORKER = Worker(progress, FreeCores(cores) if cores is not None else None)
    index = slots.get()
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())


def largest_first(jobs: list[Job], configs: RunConfigs) -> list[Job]:
    """The jobs that evaluate the most models (their own and one per inference-time method that applies: rope's
    four scalings) first, so that no worker idles at the end while the longest job runs alone; otherwise in the
    configured order. Each job is independent: the order changes the wall time only, not a number."""
    def models_evaluated(job: Job) -> int:
        model = configs[(job.encoding, job.seed)].model
        return 1 + sum(applies(method, model.position, model.layer_encodings) for method in job.compare["methods"])

    return sorted(jobs, key=lambda job: -models_evaluated(job))


def run_jobs(jobs: list[Job], workers: int, out: Path, adapt_threads: bool = False) -> dict[str, dict]:
    """Run the jobs, `workers` at a time (in this process when 1). Prints a line when a job starts a phase
    (training, evaluating, probing) and when it finishes, each with the overall progress and an ETA from the jobs
    that did work (skipped and cached ones take no time). adapt_threads: once fewer jobs are left than workers,
    the running ones take the idle workers' cores for their scoring (experiments/jobs.py FreeCores)."""
    global _WORKER
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
        _WORKER = Worker(Printer())
        try:
            for job in jobs:
                finished(job, run_job(job))
        finally:
            _WORKER = Worker()
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


def record_jobs(out: Path, command: str, wall_s: float, workers: int, threads: int, results: dict) -> None:
    """Append this invocation to OUT/invocations.jsonl, with how many jobs ended in each status."""
    statuses = [str(r["status"]).split(" ")[0] for r in results.values()]
    record_invocation(out, command, wall_s, workers=workers, threads=threads,
                      jobs={status: statuses.count(status) for status in sorted(set(statuses))})
