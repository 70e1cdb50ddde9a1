"""The one training loop, shared by pretraining, SFT and context extension.

An entry point gives a model factory and a batch source to `run_training`. The loop owns everything else:
device and precision, AdamW with warmup + cosine decay, gradient accumulation and clipping, periodic
validation, one log line per interval (also appended to metrics.jsonl), atomic checkpoints and --resume.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from errors import CommandStopped, ConfigError
from model.checkpoint import (
    CONFIG,
    DATA_FOLDER,
    TRAINER_STATE,
    TRAINING_STATE,
    WEIGHTS,
    CheckpointError,
    data_folder_record,
    has_checkpoint,
    load_config,
    load_model,
    load_trainer_state,
    load_training_state,
    load_weights_into,
    recover,
    save_checkpoint,
)
from model.config import ModelConfig
from model.folder_lock import FolderLock
from model.runtime import autocast, autocast_dtype, configure_runtime, resolve_device
from model.transformer import IGNORE_INDEX, Transformer
from train.config import RunConfig, load_run_config, to_toml
from train.distributed import Distributed
from train.nonfinite import NonFiniteGuard, NonFiniteLoss  # noqa: F401 (NonFiniteLoss is part of this API)
from train.trackers import Trackers

METRICS = "metrics.jsonl"
RUN_CONFIG = "run_config.toml"
SNAPSHOTS = "snapshots"  # OUT/snapshots/step-NNNNNN: the model at each of train.keep_steps


class TrainingInterrupted(CommandStopped):
    """Raised after Ctrl-C: a checkpoint of the last completed step was saved and --resume continues it."""

    exit_code, prefix = 130, ""  # 128 + SIGINT, as a shell reports Ctrl-C


class BatchSource(Protocol):
    # A source that reads a prepared data folder names it as `data_dir` (PretrainBatches); each save records it.
    # (inputs, targets), or (inputs, targets, positions) for batches with their own position ids (PoSE)
    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, ...]: ...

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


# Asked at each evaluation step with the model and the step: a reason to stop the training there (e.g. "validation
# exact match 0.98 >= 0.95"), or None to go on. The loop puts the model back in train mode afterwards.
StopCheck = Callable[[Transformer, int], "str | None"]


@dataclass
class TrainResult:
    steps: int
    initial_val_loss: float
    final_val_loss: float
    tokens_seen: int
    elapsed_s: float
    stopped: str | None = None  # stop_when's reason, when it ended the training


def learning_rate(step: int, config: RunConfig) -> float:
    """Linear warmup to train.lr, then cosine decay to train.lr * min_lr_ratio at max_steps, or, with
    train.lr_cycle, over each cycle of that many steps (warm restarts)."""
    train = config.train
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_cycle:
        progress = (step - train.warmup_steps) % train.lr_cycle / train.lr_cycle
    else:
        progress = (step - train.warmup_steps) / max(1, train.max_steps - train.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return train.lr * (train.min_lr_ratio + (1.0 - train.min_lr_ratio) * cosine)


def position_group_settings(model: Transformer, config: RunConfig, encoding: Any = None) -> dict[str, float]:
    """A position encoding's (default: model.position's) learning-rate scale and weight decay: the config's, else
    the encoding's defaults."""
    encoding = encoding if encoding is not None else model.position
    defaults = {"lr_scale": 1.0, "weight_decay": config.train.weight_decay, **encoding.optimizer_defaults}
    if config.train.position_lr_scale is not None:
        defaults["lr_scale"] = config.train.position_lr_scale
    if config.train.position_weight_decay is not None:
        defaults["weight_decay"] = config.train.position_weight_decay
    return defaults


def build_optimizer(model: Transformer, config: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; each position encoding's learned parameters in a group of their
    own (train.position_lr_scale, train.position_weight_decay); the fused kernel where this torch build has one."""
    train = config.train
    encodings = [(encoding, [p for p in encoding.parameters() if p.requires_grad])
                 for encoding in model.position_encodings()]
    owned = {id(p) for _, parameters in encodings for p in parameters}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in owned]
    groups = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": train.weight_decay, "lr_scale": 1.0},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    for encoding, parameters in encodings:
        if parameters:
            groups.append({"params": parameters, **position_group_settings(model, config, encoding)})
    options: dict[str, Any] = {"lr": train.lr, "betas": (train.beta1, train.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cuda", "cpu", "mps"), **options)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, **options)


@torch.inference_mode()
def evaluate_loss(model: torch.nn.Module, batches: BatchSource, device: torch.device, amp: torch.dtype | None) -> float:
    """Mean next-token loss over the batch source's validation windows."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for inputs, targets in batches.val_batches_iter():
        inputs, targets = inputs.to(device), targets.to(device)
        with autocast(device, amp):
            _, loss = model(inputs, targets, loss_reduction="sum")
        total += loss.double()
        count += int((targets != -100).sum())
    model.train(was_training)
    return float(total) / max(count, 1)


def check_out_dir(config: RunConfig, resume: bool) -> Path:
    """Refuse to write over a different run unless asked; on resume, require a compatible one."""
    out = Path(config.out.dir)
    if resume:
        recover(out)  # this run is the folder's writer: finish (or drop) its own interrupted save
        if not has_checkpoint(out):
            raise ConfigError(f"--resume: {out} holds no checkpoint to resume from")
        saved = load_trainer_state(out).get("run_config", {}).get("model")
        if saved is not None:  # through the dataclass, so settings added since the save take their defaults
            saved = ModelConfig.from_saved(saved).to_dict()
        if saved is not None and saved != config.model.to_dict():
            changed = sorted(key for key in saved if saved.get(key) != config.model.to_dict().get(key))
            raise ConfigError(
                f"--resume: the model config differs from the run in {out} (keys {changed}); "
                "resume with the same [model] settings, or start a new run in another out.dir"
            )
        return out
    if has_checkpoint(out) and not config.out.overwrite:
        raise ConfigError(
            f"out.dir {out} already holds a run; pass --resume to continue it, "
            "--out.overwrite=true to replace it, or choose another --out.dir"
        )
    if not has_checkpoint(out) and (out / METRICS).exists():
        print(f"note: {out} holds a run that stopped before its first checkpoint; starting it over", file=sys.stderr)
    if has_checkpoint(out) or (out / METRICS).exists():
        for name in (WEIGHTS, CONFIG, TRAINER_STATE, TRAINING_STATE, METRICS, RUN_CONFIG):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / SNAPSHOTS, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


class MetricsLog:
    """metrics.jsonl: one JSON record per line, appended (only by rank 0; `enabled=False` writes nothing)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def truncate_to(self, step: int) -> bool:
        """On resume from the checkpoint at `step`: keep every record up to it (its own evaluation included: the
        checkpoint is saved after it), drop what will be redone (records after it) and a line cut short by a kill;
        rewritten atomically. Returns whether the evaluation at `step` is there (then it is not run again)."""
        if not self.enabled or not self.path.exists():
            return False
        kept, evaluated = [], False
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step:
                kept.append(line + "\n")
                evaluated = evaluated or (record.get("step") == step and "val_loss" in record)
        staging = self.path.with_suffix(".jsonl.tmp")
        staging.write_text("".join(kept))
        staging.replace(self.path)
        return evaluated


def load_config_with_init(args: argparse.Namespace, overrides: list[str]) -> RunConfig:
    """Defaults, then the --checkpoint's model config, then the TOML file, then the overrides."""
    model_base = load_config(args.checkpoint).to_dict() if args.checkpoint else None
    return load_run_config(args.config, overrides, model_base)


def model_factory(config: RunConfig, init: str | None) -> Callable[[], Transformer]:
    """Fresh weights, or the weights of the --checkpoint (shapes checked against config.model), computed as the
    run's [runtime] says."""
    if init is None:
        return lambda: Transformer(config.model, config.runtime)
    return lambda: load_weights_into(Transformer(config.model, config.runtime), init)


@dataclass
class Training:
    """What one training is given: its settings, how to build a fresh model, its batches and tokenizer (saved with
    each checkpoint; None for none), whether it resumes the run saved in out.dir, its task (recorded in the
    trainer state), state of the caller's saved with each checkpoint, and a check that may stop it early."""

    config: RunConfig
    build_model: Callable[[], Transformer]
    batches: BatchSource
    tokenizer: Any = None
    resume: bool = False
    task: str = "pretrain"
    extra_state: dict[str, Any] = field(default_factory=dict)
    stop_when: StopCheck | None = None


class Trainer:
    """Holds the model, optimizer and counters of one run; `run()` trains to train.max_steps."""

    def __init__(self, training: Training) -> None:
        config, build_model, resume, task = training.config, training.build_model, training.resume, training.task
        stop_when = training.stop_when
        self.config = config
        self.stop_when = stop_when
        self.batches = training.batches
        self.tokenizer = training.tokenizer
        self.task = task
        self.extra_state = training.extra_state
        train = config.train
        configure_runtime(config.runtime)  # the process's part of [runtime]; the model's is passed to it
        self.dist = Distributed()
        if stop_when is not None and self.dist.enabled:
            raise ConfigError("a training that stops on a validation criterion runs in one process, not under DDP")
        self.device = self.dist.start(resolve_device(train.device), train.batch_size)
        self.out = Path(config.out.dir)
        if self.dist.is_main:
            check_out_dir(config, resume)
            (self.out / RUN_CONFIG).write_text(to_toml(config))
        self.dist.barrier()
        self.say(f"# resolved config ({task})\n{to_toml(config)}")
        if train.warmup_steps >= train.max_steps and self.dist.is_main:
            print(f"note: train.warmup_steps ({train.warmup_steps}) >= train.max_steps ({train.max_steps}): the "
                  "learning rate never reaches its peak and never decays; lower --train.warmup_steps",
                  file=sys.stderr)
        torch.manual_seed(train.seed)
        self.amp = autocast_dtype(self.device, train.dtype)
        self.fused_loss = train.fused_loss if train.fused_loss is not None else self.device.type != "cuda"
        self.start_step = 0
        self.state: dict[str, Any] = {"initial_val_loss": None, "val_loss": None, "tokens_seen": 0, "elapsed_s": 0.0}
        if resume:
            self.model = load_model(self.out)
            self.state = load_trainer_state(self.out)
            self.state.pop("stopped", None)  # a stopped run resumed goes on: it is not stopped any more
            self.start_step = int(self.state["step"])
        else:
            self.model = build_model()  # after seeding, so the initial weights are a function of train.seed
        self.model.to(self.device)
        self.model.train()
        self.optimizer = build_optimizer(self.model, config, self.device)
        if resume:
            training_state = load_training_state(self.out)
            try:
                self.optimizer.load_state_dict(training_state["optimizer"])
            except ValueError as error:  # e.g. a run saved before position parameters had their own group
                raise CheckpointError(
                    f"{self.out}: the saved optimizer state does not fit this optimizer ({error}); it was saved by "
                    "another pelab version or with other settings: start a new run, or --checkpoint it in a new one"
                ) from error
            torch.set_rng_state(training_state["torch_rng"])
        self.ddp = self.dist.wrap(self.model, self.device)
        self.forward = torch.compile(self.ddp) if train.compile else self.ddp
        self.log = MetricsLog(self.out / METRICS, enabled=self.dist.is_main)
        self.evaluated_step = None  # a step whose evaluation is already in the log (the resumed checkpoint's)
        if resume and self.log.truncate_to(self.start_step):
            self.evaluated_step = self.start_step
        self.trackers = Trackers(train.report_to, self.out, config.to_dict(), self.start_step,
                                 self.state.get("trackers"), train.tracker_group, enabled=self.dist.is_main)
        self.nonfinite = NonFiniteGuard(train.nonfinite, train.max_nonfinite_skips, self.optimizer, self.device,
                                        int(self.state.get("nonfinite_steps", 0)), self.report, str(self.out))
        self.loss_sum = torch.zeros((), device=self.device)
        self.gradients_checked = False  # the first applied step's gradients reach the weights
        self.finite_steps = torch.zeros((), dtype=torch.long, device=self.device)
        self.steps_since_log = 0
        self.tokens_since_log = 0
        processes = f", {self.dist.world_size} processes (DDP)" if self.dist.enabled else ""
        learned = [e for e in self.model.position_encodings() if any(p.requires_grad for p in e.parameters())]
        if learned:
            settings = position_group_settings(self.model, config, learned[0])
            processes += (f", position parameters: lr x{settings['lr_scale']:g}, "
                          f"weight decay {settings['weight_decay']:g}")
        self.say(
            f"model: {self.model.num_parameters():,} parameters, position={config.model.position}, "
            f"device={self.device.type}, autocast={self.amp or 'off (float32)'}, compile={train.compile}, "
            f"loss={'chunked head + loss' if self.fused_loss else 'full logits'}{processes}"
        )

    def record(self, record: dict[str, Any]) -> None:
        """One metrics record: metrics.jsonl and every tracker of train.report_to."""
        self.log.write(record)
        self.trackers.write(record)

    def say(self, message: str) -> None:
        if self.dist.is_main:
            print(message)

    def evaluate(self, step: int) -> float:
        # Under DDP rank 0 evaluates the bare module alone (no collectives); the others go on to the next step.
        model = self.model if self.dist.enabled else self.forward
        val_loss = evaluate_loss(model, self.batches, self.device, self.amp)
        if self.state["initial_val_loss"] is None:
            self.state["initial_val_loss"] = val_loss
        self.state["val_loss"] = val_loss
        self.say(f"step {step:5d} | val_loss {val_loss:.4f}")
        self.record({"step": step, "val_loss": val_loss})
        return val_loss

    def should_stop(self, step: int) -> bool:
        """Ask stop_when at an evaluation step; a reason to stop is logged, kept in the trainer state and printed."""
        reason = self.stop_when(self.model, step)
        self.model.train()
        if reason:
            self.state["stopped"] = {"step": step, "reason": reason}
            self.say(f"step {step:5d} | stopping: {reason}")
            self.record({"step": step, "stopped": reason})
        return bool(reason)

    def trainer_state(self, step: int, folder: Path) -> dict[str, Any]:
        """The trainer_state.json of a save into `folder` (the run folder or a snapshot)."""
        self.state["elapsed_s"] = time.perf_counter() - self.started
        state = {
            **self.state,
            "step": step,
            "task": self.task,
            "trained_seq_len": self.config.model.max_seq_len,
            "run_config": self.config.to_dict(),
            "trackers": self.trackers.ids,
            **self.extra_state,
        }
        data_dir = getattr(self.batches, "data_dir", None)  # batches read from a prepared data folder
        if data_dir is not None:
            state[DATA_FOLDER] = data_folder_record(data_dir, folder)
        return state

    def save(self, step: int, rng_state: torch.Tensor | None = None) -> None:
        """Checkpoint the state at the start of `step` (i.e. after `step` optimizer steps); rank 0 only."""
        if not self.dist.is_main:
            return
        rng = rng_state if rng_state is not None else torch.get_rng_state()
        training_state = {"optimizer": self.optimizer.state_dict(), "torch_rng": rng}
        save_checkpoint(self.out, self.model, self.tokenizer, self.trainer_state(step, self.out), training_state)

    def save_snapshot(self, step: int) -> None:
        """Keep the model at `step` (train.keep_steps) as a checkpoint folder of its own (no optimizer state)."""
        folder = self.out / SNAPSHOTS / f"step-{step:06d}"
        if self.dist.is_main and not has_checkpoint(folder):
            save_checkpoint(folder, self.model, self.tokenizer, self.trainer_state(step, folder))
            self.say(f"step {step:5d} | kept a snapshot in {folder}")

    def train_step(self, step: int) -> None:
        """One optimizer step over grad_accum micro-batches; logs every log_interval steps."""
        train = self.config.train
        lr = learning_rate(step, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        step_loss = torch.zeros((), device=self.device)
        for micro_step in range(train.grad_accum):
            inputs, targets, *rest = self.batches.train_batch(step, micro_step)
            positions = rest[0] if rest else None  # PoSE batches carry their own position ids
            # Normalise by the scored tokens of the whole global micro-batch (counted on the host, no sync), so
            # each rank's share of the mean is exact even when ranks hold different numbers of scored tokens.
            scored = max(1, int((targets != IGNORE_INDEX).sum()))
            self.tokens_since_log += inputs.numel()
            self.state["tokens_seen"] += inputs.numel()
            inputs, targets = self.dist.shard(inputs), self.dist.shard(targets)
            if self.device.type == "cuda":
                inputs, targets = inputs.pin_memory(), targets.pin_memory()
            inputs = inputs.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            if positions is not None:
                positions = self.dist.shard(positions).to(self.device, non_blocking=True)
            with self.dist.no_sync(self.ddp, sync=micro_step == train.grad_accum - 1):
                with autocast(self.device, self.amp):
                    _, loss_sum = self.forward(inputs, targets, positions=positions, loss_reduction="sum",
                                              return_logits=not self.fused_loss)
                loss = loss_sum * (self.dist.world_size / scored)  # DDP averages gradients over ranks
                (loss / train.grad_accum).backward()
            step_loss += loss.detach()
        step_loss = self.dist.mean(step_loss)  # the global mean loss, the same on every rank
        finite = self.nonfinite.admit(step + 1, step_loss)
        if finite is None:  # dropped on the host: never applied
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.loss_sum += torch.where(finite, step_loss, 0.0)
        self.finite_steps += finite.long()
        if not self.gradients_checked:
            self.check_gradients()
            self.gradients_checked = True
            self.record_attention_paths()
        if train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        for encoding in self.model.position_encodings():
            encoding.constrain_()  # e.g. KERPLE's r1, r2 back to >= 0.01
        self.steps_since_log += 1
        if (step + 1) % train.log_interval == 0 or step + 1 == train.max_steps:
            self.log_interval(step + 1, lr)

    def check_gradients(self) -> None:
        """After the first applied step of this process: some gradient reached the weights. A step that lost its
        backward would otherwise train nothing and save a model at its initial loss (as a compiled step did on
        CUDA with torch 2.11 while the fused loss was traced: docs/performance.md, "GPU")."""
        if not any(p.grad is not None and bool(p.grad.ne(0).any()) for p in self.model.parameters()):
            raise RuntimeError(f"{self.out}: the first training step left every gradient None or zero "
                               f"(compile={self.config.train.compile}, device={self.device.type}); nothing "
                               "would be learned. This is a bug in pelab or torch: try --train.compile=false, "
                               "and report it with the torch version")

    def record_attention_paths(self) -> None:
        """Once per run, after the first applied step: the attention path each layer's training forward took
        (model/attention/registry.py; a compiled step records it too), said and kept in the trainer state."""
        paths = self.model.attention_paths()
        self.state["attention_paths"] = paths
        for layers, path in paths.items():
            self.say(f"attention ({layers}): {path}")

    def report(self, record: dict[str, Any], message: str) -> None:
        """A non-finite step: counted in the trainer state, logged, and said (the guard decides the policy)."""
        self.state["nonfinite_steps"] = self.nonfinite.skipped
        self.record(record)
        if message:
            self.say(message)

    def log_interval(self, step: int, lr: float) -> None:
        self.nonfinite.reconcile()
        finite_steps = int(self.finite_steps)  # the one read of the device per log interval
        now = time.perf_counter()
        dt = (now - self.last_log) / self.steps_since_log
        tokens_per_s = self.tokens_since_log / (now - self.last_log)
        self.tokens_since_log = 0
        if finite_steps:  # an interval of skipped steps only has no loss to show
            mean_loss = float(self.loss_sum) / (finite_steps * self.config.train.grad_accum)
            self.say(f"step {step:5d}/{self.config.train.max_steps} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                     f"dt {dt * 1000:.0f}ms | tok/s {tokens_per_s:,.0f} | eta {self.eta(step, now)}")
            self.record({"step": step, "loss": mean_loss, "lr": lr, "dt": dt, "tok_per_s": tokens_per_s})
        self.last_log = now
        self.loss_sum.zero_()
        self.finite_steps.zero_()
        self.steps_since_log = 0

    def eta(self, step: int, now: float) -> str:
        """Time left at this run's pace so far (steps done in this process, evaluations and saves included)."""
        done = step - self.start_step
        seconds = (now - self.run_started) / max(1, done) * (self.config.train.max_steps - step)
        minutes, seconds = divmod(int(round(seconds)), 60)
        return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"

    def leave_group(self, wait: bool = True) -> None:
        """Drop the DistributedDataParallel wrapper, then leave the process group. The wrapper's reducer holds the
        gloo group and its threads: left alive past destroy_process_group, they are destroyed at interpreter exit,
        where a still-joinable thread aborts the process ("terminate called without an active exception", SIGABRT)
        after the run has finished and saved, so torchrun reports it failed. Dropped here, the group's threads end
        while the interpreter still runs."""
        if self.dist.enabled:
            self.ddp = self.forward = None
            gc.collect()
        self.dist.close(wait=wait)

    def run(self) -> TrainResult:
        train = self.config.train
        self.started = time.perf_counter() - float(self.state["elapsed_s"])
        self.last_log = self.run_started = time.perf_counter()
        final_step = train.max_steps
        for step in range(self.start_step, train.max_steps + 1):
            step_rng = torch.get_rng_state()
            try:
                evaluating = step % train.eval_interval == 0 or step == train.max_steps
                saving = step > self.start_step and step % (train.save_interval or train.eval_interval) == 0
                if evaluating or saving:
                    self.nonfinite.reconcile()  # every rank: the same counts, the same decision
                if evaluating and self.dist.is_main and step != self.evaluated_step:
                    self.evaluate(step)
                if step in train.keep_steps:
                    self.save_snapshot(step)
                if evaluating and self.stop_when is not None and step > self.start_step and self.should_stop(step):
                    final_step = step
                    break
                if step == train.max_steps:
                    break
                if saving:
                    self.save(step)
                if train.compile and step == self.start_step:  # compilation happens in the first step
                    compile_started = time.perf_counter()
                    self.train_step(step)
                    self.state["compile_s"] = time.perf_counter() - compile_started
                    self.say(f"torch.compile: the first step took {self.state['compile_s']:.1f}s (compilation included)")
                else:
                    self.train_step(step)
            except KeyboardInterrupt:
                self.optimizer.zero_grad(set_to_none=True)
                self.save(step, step_rng)
                raise TrainingInterrupted(f"interrupted at step {step}; saved {self.out}; continue with --resume") from None
        self.save(final_step)
        if not self.dist.is_main:  # rank 0 holds the evaluations
            return TrainResult(final_step, math.nan, math.nan, int(self.state["tokens_seen"]),
                               time.perf_counter() - self.started)
        initial, final = float(self.state["initial_val_loss"]), float(self.state["val_loss"])
        print(
            f"final val_loss {final:.4f} (step 0: {initial:.4f}, ln(vocab) = {math.log(self.config.model.vocab_size):.4f}); "
            f"{self.state['tokens_seen']:,} tokens in {self.state['elapsed_s']:.0f}s; checkpoint: {self.out}"
        )
        return TrainResult(final_step, initial, final, int(self.state["tokens_seen"]), float(self.state["elapsed_s"]),
                           (self.state.get("stopped") or {}).get("reason"))


def run_training(training: Training) -> TrainResult:
    """Train `training.build_model()` (or the checkpoint in out.dir when resuming) to train.max_steps, or until
    `training.stop_when(model, step)`, asked at each evaluation step, returns a reason to stop (one process only):
    the checkpoint is then that step's.

    Under torchrun this is one rank of a data-parallel run (train/distributed.py).
    """
    # One writer per folder (rank 0 writes), taken before anything in it is read or changed, held to the end.
    config = training.config
    with FolderLock(config.out.dir, "training run") if Distributed().is_main else contextlib.nullcontext():
        trainer = Trainer(training)
        try:
            result = trainer.run()
        except OSError as error:
            trainer.leave_group(wait=False)
            if error.errno in (errno.ENOSPC, errno.EDQUOT):  # e.g. appending to metrics.jsonl on a full disk
                raise CheckpointError(f"{config.out.dir}: {error.strerror} while writing {error.filename or 'a file'}; "
                                      "the last complete checkpoint is intact: free space and continue with "
                                      "--resume") from error
            raise
        except BaseException:
            trainer.leave_group(wait=False)
            raise
        finally:
            trainer.trackers.close()
        trainer.leave_group()
        return result
