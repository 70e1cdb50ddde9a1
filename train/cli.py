"""What the training entry points share: arguments, the model factory, vocabulary checks."""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Callable

from commands import add_checkpoint, add_out, command_parser, renamed
from errors import ConfigError
from model.checkpoint import has_checkpoint, load_config, load_trainer_state, load_weights_into
from model.transformer import Transformer
from train.config import RunConfig, build_run_config, load_run_config, toml_value


def build_parser(module: str, description: str | None, data_key: str = "data.dir",
                 data_help: str = "a prepared data folder") -> argparse.ArgumentParser:
    """The options every training command shares: --config, --checkpoint, --data, --out, --overwrite, --resume.
    --data, --out and --overwrite are shorthands for the config keys they name."""
    parser = command_parser(module, description, epilog="Any config key can be set as --section.key=value, e.g. "
                                                        "--train.lr=1e-3 --model.position=none")
    parser.add_argument("--config", metavar="FILE", help="TOML run config (see configs/)")
    add_checkpoint(parser, "start from this checkpoint's weights; its config.json is the base of [model]")
    renamed(parser, "--init", "--checkpoint")
    parser.add_argument("--data", metavar="PATH", help=f"{data_help}: shorthand for --{data_key}=PATH")
    add_out(parser, "the run folder: shorthand for --out.dir=DIR")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in the run folder: shorthand for --out.overwrite=true")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in the run folder")
    parser.set_defaults(data_key=data_key)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(args, overrides): the shorthands become overrides after those given as --section.key=value."""
    args, overrides = parser.parse_known_args(argv)
    if args.data is not None:
        overrides.append(f"--{args.data_key}={toml_value(args.data)}")
    if args.out is not None:
        overrides.append(f"--out.dir={toml_value(args.out)}")
    if args.overwrite:
        overrides.append("--out.overwrite=true")
    return args, overrides


def load_config_with_init(args: argparse.Namespace, overrides: list[str]) -> RunConfig:
    """Defaults, then the --checkpoint's model config, then the TOML file, then the overrides."""
    model_base = load_config(args.checkpoint).to_dict() if args.checkpoint else None
    return load_run_config(args.config, overrides, model_base)


# What --resume may change in a run, each with what it means.
RESUME_CHANGEABLE = {
    "train.max_steps": "the run goes on to the new end; its learning-rate schedule is stretched to it from here on",
    "train.log_interval": "", "train.eval_interval": "", "train.save_interval": "", "train.device": "",
    "train.compile": "", "train.nonfinite": "", "train.max_nonfinite_skips": "", "out.overwrite": "",
    "train.report_to": "", "train.tracker_group": "",
}


def resolve_resume(requested: RunConfig, overrides: list[str], resume: bool) -> tuple[RunConfig, bool]:
    """--resume continues the run saved in out.dir with the run's own settings: a key set on the command line
    (--section.key=value) that differs is applied if --resume may change it (RESUME_CHANGEABLE, with a note) and
    refused otherwise; values from a --config file or the defaults never override the run's. A folder with no
    checkpoint yet (a run killed before its first save) starts from the beginning, with a note.

    Returns the config to run and whether to resume."""
    if not resume:
        return requested, False
    out = Path(requested.out.dir)
    if not has_checkpoint(out):
        print(f"note: --resume: {out} holds no checkpoint yet (the run stopped before its first save); "
              "starting it from the beginning", file=sys.stderr)
        return requested, False
    saved = build_run_config(copy.deepcopy(load_trainer_state(out).get("run_config", {})), f"{out} (saved run)",
                             saved=True)
    values, wanted = saved.to_dict(), requested.to_dict()
    values["out"]["dir"] = wanted["out"]["dir"]  # the folder resumed is the run, wherever it was first written
    explicit = dict.fromkeys(override[2:].split("=", 1)[0] for override in overrides if override.startswith("--"))
    refused, applied = [], []
    for dotted in explicit:
        section, key = dotted.split(".")[:2]  # a key of a table (model.position_args.t5.max_distance): the table
        if section not in values or key not in values[section] or values[section][key] == wanted[section][key]:
            continue
        if dotted in RESUME_CHANGEABLE:
            values[section][key] = wanted[section][key]
            applied.append(f"{dotted} = {wanted[section][key]!r}" + (f" ({RESUME_CHANGEABLE[dotted]})"
                                                                    if RESUME_CHANGEABLE[dotted] else ""))
        else:
            refused.append(f"{dotted} ({values[section][key]!r} in the run, {wanted[section][key]!r} asked)")
    if refused:
        raise ConfigError(f"--resume continues the run in {out} with its own settings, and these cannot change in a "
                          f"run: {'; '.join(refused)}; start a new run in another --out.dir to change them")
    ignored = sorted(f"{section}.{key}" for section, keys in wanted.items() for key, value in keys.items()
                     if f"{section}.{key}" not in explicit and values[section].get(key) != value)
    if ignored:
        print(f"note: --resume keeps the run's own settings for {', '.join(ignored)} (from the config file or the "
              "defaults); set one on the command line to change it where --resume allows", file=sys.stderr)
    for line in applied:
        print(f"note: --resume changes {line}", file=sys.stderr)
    return build_run_config(values, str(out)), True


def model_factory(config: RunConfig, init: str | None) -> Callable[[], Transformer]:
    """Fresh weights, or the weights of the --checkpoint (shapes checked against config.model)."""
    if init is None:
        return lambda: Transformer(config.model)
    return lambda: load_weights_into(Transformer(config.model), init)


def check_vocab(config: RunConfig, tokenizer_vocab: int, where: str) -> None:
    if tokenizer_vocab > config.model.vocab_size:
        raise ConfigError(
            f"the tokenizer in {where} has {tokenizer_vocab} tokens but model.vocab_size is "
            f"{config.model.vocab_size}; set --model.vocab_size={tokenizer_vocab} or larger"
        )
