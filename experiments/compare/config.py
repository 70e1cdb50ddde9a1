"""A comparison's settings: `CompareConfig` ([compare] of the config), and its loading from the TOML file, a
preset of it and `--section.key=value` overrides, with the shared [model] and [train] values every variant trains
with. Imports no other module of experiments.compare: everything else of the comparison reads it.
"""
from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commands import comma_list, did_you_mean
from data.tasks import TASKS
from errors import ConfigError
from eval.extrapolation import parse_lengths
from model.encodings import POSITION_ENCODINGS
from model.fields import check_field_types, check_keys
from model.methods import check_methods
from model.recipes import RECIPES, expand
from train.config import RunConfig, build_run_config, parse_override_value, set_dotted

# The probes a comparison can run on every trained model (compare.probes); experiments/compare/probes.py runs them.
PROBE_NAMES = ("attention", "induction", "passkey", "use")
RunConfigs = dict[tuple[str, int], RunConfig]  # (encoding, seed) -> the run config that variant trains with


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
    # Training settings of single encodings or variants over the shared [train]: name -> {key: value}, e.g.
    # {fox = {lr = 0.01}} ([compare.train_settings] in TOML): each encoding's own learning rate (docs/baselines.md).
    train_settings: dict = field(default_factory=dict)
    methods: list = field(default_factory=lambda: ["linear", "ntk", "dynamic", "yarn", "clamp"])
    lengths: list = field(default_factory=lambda: ["1x", "2x", "4x", "8x", "16x"])
    eval_tokens: int = 16384
    reference_stride: int = 0  # 0: L / 8
    seeds: list = field(default_factory=lambda: [1337])
    snapshots: list = field(default_factory=list)  # fractions of train.max_steps whose models are also evaluated
    # inference-time methods the snapshots are evaluated under too, where they are among compare.methods and apply
    snapshot_methods: list = field(default_factory=lambda: ["clamp"])
    probes: list = field(default_factory=list)  # of PROBE_NAMES (experiments/compare/probes.py)
    # probes also run on every snapshot (compare.snapshots): "use", for use against the tokens trained
    snapshot_probes: list = field(default_factory=list)
    probe_lengths: list = field(default_factory=lambda: ["1x", "4x"])
    probe_tokens: int = 16384  # held-out tokens per length for the attention diagnostics
    passkey_trials: int = 50  # per (length, depth) and seed
    # the use probe (experiments/compare/use.py): distances between the repeated passages at the longest length,
    # multiples of L or tokens or "max" (the first, within L, is the positive control); windows per model; the
    # equivalence margin of its "none" verdict, nats
    use_distances: list = field(default_factory=lambda: ["0.5x", "2x", "4x", "8x", "max"])
    use_windows: int = 64
    use_margin: float = 0.05
    # the priming control (eval/use.py --priming): a third forward per window whose first copies hold the passages'
    # tokens shuffled, so the table splits use into presence (the tokens in context) and order (reading them in order)
    use_priming: bool = False
    tasks: list = field(default_factory=list)  # synthetic tasks trained per encoding (data/tasks.py)
    task_steps: int = 12000  # the cap on each task model's training steps (experiments.tasks default)
    task_until: float = 0.95  # stop a task model's training at this validation exact match at L (0: train to the cap)
    task_cycle: int = 0  # the task models' learning-rate cycle and stop check, in steps (0: experiments.tasks' 3,000)
    task_count: int = 256  # fresh test sequences per length (per cell of a retrieval grid: at most 128)
    workers: int = 0  # 0: one per usable CPU core (one per GPU on CUDA)
    threads: int = 0  # torch threads per worker; 0: CPU cores / workers
    out: str = "runs/compare"
    # Other comparisons' output folders whose finished models this one copies instead of training them, where one
    # was trained with the same settings on byte-identical data (experiments/compare/reuse.py).
    reuse: list = field(default_factory=list)

    def __post_init__(self) -> None:
        check_field_types(self, "compare")
        parse_lengths(",".join(self.lengths))
        check_methods(self.methods)
        check_methods(self.snapshot_methods)  # applied where they are also among compare.methods
        for name, settings in self.variants.items():
            if name in POSITION_ENCODINGS or not isinstance(settings, dict) or \
                    ("position" not in settings) == ("recipe" not in settings):
                raise ConfigError(f"compare.variants.{name}: a variant is a table of model settings that sets "
                                  f"model.position, or names a recipe ({sorted(RECIPES)}), under a name that is not "
                                  f"an encoding's; got {settings!r}")
            if settings.get("recipe", sorted(RECIPES)[0]) not in RECIPES:
                raise ConfigError(f"compare.variants.{name}: recipe {settings['recipe']!r} is not one of "
                                  f"{sorted(RECIPES)}")
        valid = sorted(POSITION_ENCODINGS) + sorted(self.variants)
        unknown = [name for name in self.encodings if name not in valid]
        if unknown or not self.encodings:
            raise ConfigError(f"compare.encodings: unknown {unknown}; valid names are the encodings "
                              f"{sorted(POSITION_ENCODINGS)} and the variants {sorted(self.variants)}")
        stray = [name for name in self.train_settings if name not in valid]
        if stray or any(not isinstance(settings, dict) for settings in self.train_settings.values()):
            raise ConfigError(f"compare.train_settings: a table of [train] settings per encoding or variant, e.g. "
                              f"{{fox = {{lr = 0.01}}}}; {stray or self.train_settings} are not")
        if len(set(self.encodings)) != len(self.encodings):
            raise ConfigError(f"compare.encodings lists a name twice: {self.encodings}")
        if self.eval_tokens <= 0 or not 0 < self.val_fraction < 1:
            raise ConfigError("compare.eval_tokens must be positive and compare.val_fraction in (0, 1)")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"compare.seeds must be a non-empty list of distinct integers, got {self.seeds}")
        if any(not isinstance(f, (int, float)) or not 0 < f < 1 for f in self.snapshots):
            raise ConfigError(f"compare.snapshots must be fractions of training in (0, 1), got {self.snapshots}")
        unknown = [name for name in self.probes if name not in PROBE_NAMES] + [n for n in self.tasks if n not in TASKS]
        if unknown:
            raise ConfigError(f"compare.probes / compare.tasks: unknown {unknown}; probes are {sorted(PROBE_NAMES)}, "
                              f"tasks are {sorted(TASKS)}")
        if any(name not in ("use",) for name in self.snapshot_probes) or \
                (self.snapshot_probes and not self.snapshots):
            raise ConfigError(f"compare.snapshot_probes: [\"use\"] runs the use probe on every model that "
                              f"compare.snapshots keeps (set those too); got {self.snapshot_probes}")
        parse_lengths(",".join(self.probe_lengths))
        if self.task_cycle < 0:
            raise ConfigError(f"compare.task_cycle is a number of steps >= 0 (0: the default cycle), got "
                              f"{self.task_cycle}")
        parse_lengths(",".join(d for d in self.use_distances if d != "max") or "1x")
        if self.use_windows < 1 or self.use_margin <= 0:
            raise ConfigError(f"compare.use_windows must be >= 1 and compare.use_margin > 0, got {self.use_windows} "
                              f"and {self.use_margin}")
        if min(self.probe_tokens, self.passkey_trials, self.task_steps, self.task_count) < 1:
            raise ConfigError("compare.probe_tokens, passkey_trials, task_steps and task_count must be positive")
        if not 0 <= self.task_until <= 1:
            raise ConfigError(f"compare.task_until is an exact match in [0, 1] (0: off), got {self.task_until}")
        missing = [folder for folder in self.reuse if not isinstance(folder, str) or not (Path(folder) / "runs").is_dir()]
        if missing:
            raise ConfigError(f"compare.reuse: {missing} are not comparisons' output folders (each holds runs/); "
                              "name the compare.out of a comparison that has trained, or leave compare.reuse empty")
        if min(self.workers, self.threads, self.max_documents, self.reference_stride) < 0:
            raise ConfigError("compare.workers, threads, max_documents and reference_stride must be >= 0")

    def model_settings(self, name: str, shared: dict | None = None) -> dict[str, Any]:
        """The model settings that make `name` (an encoding or a variant) differ from the shared [model] settings
        `shared`: a variant's own, and the position_args of the encodings it uses, from `shared` and then from the
        variant (an encoding's settings in the shared [model] reach the runs of that encoding only)."""
        shared = shared or {}
        own = copy.deepcopy(expand(self.variants.get(name, {"position": name}), shared))
        args = copy.deepcopy(shared.get("position_args", {}))
        for encoding, settings in own.pop("position_args", {}).items():
            args[encoding] = {**args.get(encoding, {}), **settings}
        used = set(own.get("position_layers", shared.get("position_layers")) or []) | {own["position"]}
        args = {encoding: settings for encoding, settings in args.items() if encoding in used}
        return {**own, "position_args": args} if args else own

    def train_of(self, name: str, shared: dict | None = None) -> dict[str, Any]:
        """The [train] settings `name` trains with: the shared ones, then its own (compare.train_settings)."""
        return {**copy.deepcopy(shared or {}), **copy.deepcopy(self.train_settings.get(name, {}))}

    def position_of(self, name: str) -> str:
        variant = self.variants.get(name, {"position": name})
        # a recipe's encoding does not depend on the shape: any shape its layer pattern fits names it
        return expand(variant, {"n_layers": 12, "max_seq_len": 1024})["position"]


def run_model(shared: dict, settings: dict) -> dict:
    """A run's [model]: the shared settings without their position_args, and the run's own settings
    (CompareConfig.model_settings, which carries the position_args that reach the run)."""
    return {**{key: value for key, value in copy.deepcopy(shared).items() if key != "position_args"},
            **copy.deepcopy(settings)}


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
            raise ConfigError(f"--preset {preset!r} is not in {path}; available: {sorted(presets)}"
                              f"{did_you_mean(preset, presets)}")
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
    if "encoding_settings" in compare_values:
        raise ConfigError("compare.encoding_settings is now [model] position_args: an encoding's settings there "
                          "reach the runs of that encoding only (e.g. \"model.position_args\" = {t5 = {max_distance "
                          "= 64}})")
    compare = CompareConfig(**check_keys(CompareConfig, compare_values, "compare"))
    for section in ("data", "out"):
        if section in values:
            raise ConfigError(f"{path}: [{section}] is set by experiments.compare itself; use [compare] source/out instead")
    for encoding in compare.encodings:  # every variant's config is valid before anything trains
        settings = compare.model_settings(encoding, values.get("model"))
        build_run_config({**copy.deepcopy(values), "model": run_model(values.get("model", {}), settings),
                          "train": compare.train_of(encoding, values.get("train"))}, f"{path} ({encoding}: {settings})")
    return compare, values, preset or "default"
