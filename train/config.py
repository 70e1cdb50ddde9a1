"""Run configuration: dataclass defaults -> TOML file -> `--section.key=value` overrides, strictly typed.

Sections: [model] (ModelConfig), [data], [train], [out], [runtime] (RuntimeConfig: switches of how, not what,
the process computes). Unknown sections or keys and wrong types are errors
that name the key; the resolved config is printed and saved with the run as run_config.toml.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

from commands import nearest
from errors import ConfigError
from model.config import ModelConfig
from model.fields import check_field_types, check_keys, parse_override_value, set_dotted, toml_value
from model.legacy_keys import LEGACY_KEYS
from model.runtime_config import RETIRED, RuntimeConfig
from train.trackers import TRACKERS


@dataclass
class DataConfig:
    dir: str = "runs/data/stdlib"  # pretraining: a folder written by `python -m data.prepare`
    source: str = ""  # SFT: stdlib, minimind, or a conversations .jsonl
    val_fraction: float = 0.05  # SFT: share of conversations held out

    def __post_init__(self) -> None:
        check_field_types(self, "data")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")


@dataclass
class TrainConfig:
    seed: int = 1337
    batch_size: int = 16  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 1000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    # > 0: the cosine restarts every lr_cycle steps after warmup (SGDR, Loshchilov & Hutter 2017), each cycle decaying
    # to lr * min_lr_ratio; 0: one decay over the whole run (to max_steps)
    lr_cycle: int = 0
    warmup_steps: int = 50
    weight_decay: float = 0.1  # on weight matrices; norms and the position encoding's own parameters have their own
    # The position encoding's learned parameters (T5 buckets, Shaw vectors, a learned table) have their own AdamW
    # group: learning rate train.lr times position_lr_scale (same warmup and decay), and position_weight_decay.
    # None: the encoding's own measured defaults (PositionEncoding.optimizer_defaults; see docs/baselines.md).
    position_lr_scale: float | None = None
    position_weight_decay: float | None = None
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    dtype: str = "auto"  # auto (bf16 autocast where the hardware supports it) | bfloat16 | float32
    compile: bool = False  # torch.compile the model
    # The head and the loss in chunks of rows, never holding the (batch x time x vocab) logits (model/loss.py).
    # None (auto): on the CPU, where it is faster (1.12-1.19x the full logits' step at the tiny shape); not on CUDA,
    # where the full logits are faster (H200, research shapes: 1.3-1.7x) (docs/performance.md).
    fused_loss: bool | None = None
    device: str = "auto"  # auto | cpu | cuda | mps
    log_interval: int = 10
    eval_interval: int = 100  # also evaluated at step 0 and at the end
    eval_batches: int = 8
    save_interval: int = 0  # 0: save at each evaluation and at the end
    keep_steps: list = field(default_factory=list)  # also keep the model at these steps, in OUT/snapshots/step-N
    # A step whose loss is not finite is never applied. "skip": drop it and go on (at most max_nonfinite_skips
    # times in a run); "stop": stop at once, keeping the last good checkpoint in out.dir.
    nonfinite: str = "skip"
    max_nonfinite_skips: int = 5
    # Where metrics go besides metrics.jsonl (always written): "tensorboard", "wandb" (train/trackers.py).
    report_to: list = field(default_factory=lambda: ["jsonl"])
    tracker_group: str = ""  # a group for the tracker runs (experiments.compare sets one per comparison)

    def __post_init__(self) -> None:
        check_field_types(self, "train")
        unknown = [name for name in self.report_to if name not in TRACKERS]
        if unknown:
            raise ConfigError(f"train.report_to: unknown {unknown}; valid trackers are {list(TRACKERS)}")
        positive = ("batch_size", "grad_accum", "max_steps", "log_interval", "eval_interval", "eval_batches")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("train.lr must be positive and train.min_lr_ratio in [0, 1]")
        if (self.position_lr_scale is not None and self.position_lr_scale <= 0) or self.weight_decay < 0 or (
                self.position_weight_decay is not None and self.position_weight_decay < 0):
            raise ConfigError("train.position_lr_scale must be positive; train.weight_decay and "
                              "train.position_weight_decay must be >= 0")
        if self.warmup_steps < 0 or self.save_interval < 0 or self.grad_clip < 0 or self.lr_cycle < 0:
            raise ConfigError("train.warmup_steps, train.save_interval, train.grad_clip and train.lr_cycle must be >= 0")
        if any(not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= self.max_steps
               for step in self.keep_steps):
            raise ConfigError(f"train.keep_steps must be a list of steps in 1..max_steps ({self.max_steps}), "
                              f"got {self.keep_steps}")
        if self.dtype not in ("auto", "bfloat16", "float32"):
            raise ConfigError(f"train.dtype must be auto, bfloat16 or float32, got {self.dtype!r}")
        if self.nonfinite not in ("skip", "stop") or self.max_nonfinite_skips < 0:
            raise ConfigError("train.nonfinite must be 'skip' or 'stop' and train.max_nonfinite_skips >= 0")
        if self.device not in ("auto", "cpu", "cuda", "mps"):
            raise ConfigError(f"train.device must be auto, cpu, cuda or mps, got {self.device!r}")


@dataclass
class OutConfig:
    dir: str = "runs/tiny"
    overwrite: bool = False  # replace a different run already in dir

    def __post_init__(self) -> None:
        check_field_types(self, "out")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: OutConfig = field(default_factory=OutConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


SECTIONS = {field.name: field.type for field in dataclasses.fields(RunConfig)}
SECTION_CLASSES = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "out": OutConfig,
                   "runtime": RuntimeConfig}


def apply_overrides(values: dict[str, dict[str, Any]], overrides: list[str]) -> None:
    """Set each `--section.key=value` of `overrides` in `values` (each checked first: check_override)."""
    for override in overrides:
        check_override(override, section_keys())
        key, text = override[2:].split("=", 1)
        set_dotted(values, key, parse_override_value(text), f"override {override!r}")


def section_keys() -> dict[str, list[str]]:
    """Section -> the keys its dataclass takes."""
    return {name: [field.name for field in dataclasses.fields(cls)] for name, cls in SECTION_CLASSES.items()}


def build_run_config(values: dict[str, Any], where: str = "config", saved: bool = False) -> RunConfig:
    """The run config of `values` (by section); saved=True: a run's own saved settings, which may spell the
    encodings' settings as configs did before model.position_args (user input may not)."""
    unknown = sorted(set(values) - set(SECTION_CLASSES))
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; valid sections are {list(SECTION_CLASSES)}")
    sections = {}
    for name, cls in SECTION_CLASSES.items():
        section = values.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{where}: [{name}] must be a table of keys")
        if cls is RuntimeConfig:
            section = retire_runtime_keys(section, where, saved)
        if cls is ModelConfig:
            sections[name] = ModelConfig.from_saved(section) if saved else ModelConfig.from_dict(section)
        else:
            sections[name] = cls(**check_keys(cls, section, name))
    return RunConfig(**sections)


def retire_runtime_keys(section: dict[str, Any], where: str, saved: bool) -> dict[str, Any]:
    """[runtime] without the switches the model's attention backend replaced (model/runtime.py RETIRED): dropped
    from a saved run's settings, refused with their replacement in user input."""
    retired = [key for key in section if key in RETIRED]
    if retired and not saved:
        raise ConfigError(f"{where}: runtime.{retired[0]} is retired; use {RETIRED[retired[0]]}")
    return {key: value for key, value in section.items() if key not in RETIRED}


def load_run_config(
    path: str | Path | None, overrides: list[str] = (), model_base: dict[str, Any] | None = None,
    base: dict[str, dict[str, Any]] | None = None,
) -> RunConfig:
    """Defaults -> `base` (a command's own defaults, by section) and `model_base` (an initial checkpoint's model
    config) -> TOML file -> overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        values = read_toml(path)
        if isinstance(values.get("runtime"), dict):
            retire_runtime_keys(values["runtime"], str(path), saved=False)
        check_names(values, str(path), section_keys())
    for section, defaults in (base or {}).items():
        if isinstance(values.get(section, {}), dict):
            values[section] = {**defaults, **values.get(section, {})}
    apply_overrides(values, list(overrides))
    if model_base is not None:
        values["model"] = {**model_base, **values.get("model", {})}
    return build_run_config(values, str(path or "config"))


def to_toml(config: RunConfig) -> str:
    """The resolved config as TOML that load_run_config reads back to an equal RunConfig (None keys omitted)."""
    lines = []
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None)
        lines.append("")
    return "\n".join(lines)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML config file's values; a missing or malformed file is a ConfigError naming it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} not found (see configs/ for examples)")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML ({error})") from error


def dotted_names(known: dict[str, Collection[str]]) -> list[str]:
    return [f"{section}.{key}" for section, keys in known.items() for key in keys]


def check_names(values: dict[str, Any], where: str, known: dict[str, Collection[str]]) -> None:
    """Refuse a section or key of `values` (a config file's, an override's) that the run config does not have, naming
    `where` and the nearest name. [model] keys of configs written before model.position_args (LEGACY_KEYS) are left
    to ModelConfig, which names an encoding setting's new spelling."""
    for section, keys in values.items():
        if section not in known:
            match = nearest(section, known)
            hint = f"did you mean [{match}]?" if match else f"valid sections are {', '.join(known)}"
            raise ConfigError(f"{where}: unknown section [{section}]; {hint}")
        if not isinstance(keys, dict):
            continue  # "must be a table of keys": said where the section is built
        for key in keys:
            if key in known[section] or (section == "model" and key in LEGACY_KEYS):
                continue
            elsewhere = {name: f"{other}.{name}" for other, names in known.items() for name in names}
            if key in elsewhere:  # the key of another section: --model.max_steps -> train.max_steps
                match = elsewhere[key]
            elif (close := nearest(key, known[section])) is not None:
                match = f"{section}.{close}"
            else:
                match = elsewhere.get(nearest(key, elsewhere) or "")
            hint = f"did you mean {match}?" if match else f"valid keys of [{section}] are {', '.join(known[section])}"
            raise ConfigError(f"{where}: unknown key {section}.{key}; {hint}")


def check_override(override: str, known: dict[str, Collection[str]]) -> None:
    """An override's form (--section.key=value) and its section and key (check_names)."""
    name, _, _ = override[2:].partition("=")
    if not override.startswith("--") or "=" not in override or "." not in name:
        suggestion = suggest_override(override.split("=", 1)[0], override.partition("=")[2] or None, known)
        raise ConfigError(f"override {override!r} must look like --section.key=value (e.g. --train.lr=1e-3)"
                          f"{suggestion}")
    section, key = (name.split(".") + [""])[:2]
    check_names({section: {key: None}}, f"override {override!r}", known)


def suggest_override(flag: str, value: str | None, known: dict[str, Collection[str]],
                     options: Collection[str] = ()) -> str:
    """"; did you mean --train.max_steps=VALUE?" for `flag` (e.g. --max-steps, or --train.max_steps without "="):
    the nearest of `options` (the command's flags) and of the config keys, bare (max_steps) or dotted, or ""."""
    word = flag.lstrip("-").replace("-", "_")
    value = value if value is not None else "..."
    dotted = dotted_names(known)
    if word in dotted:
        return f"; did you mean --{word}={value}?"
    flags = {option.lstrip("-").replace("-", "_"): option for option in options}
    bare = {}
    for name in dotted:
        bare.setdefault(name.split(".", 1)[1], name)
    match = nearest(word, [*flags, *bare, *dotted])
    if match is None:
        return ""
    if match in flags:
        return f"; did you mean {flags[match]}?"
    return f"; did you mean --{bare.get(match, match)}={value}?"
