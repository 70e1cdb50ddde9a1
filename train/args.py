"""The command line of the training commands (train.pretrain, train.sft, train.extend), checked before torch loads.

The options every training command shares, and the names of a run config's sections and keys: a misspelled flag, an
override not written as --section.key=value, or a key that no section has, in an override or in the --config file,
is refused at once, with the nearest name ("did you mean --train.max_steps=100?"), before the command imports torch
and the model (which take seconds). The names are the config dataclasses' fields (`config_keys`, from train/config.py, which
imports no plug-in and not torch: ModelConfig and RuntimeConfig are plain data). The [model] keys of configs written before
model.position_args (model/legacy_keys.py) are left to the full check (train/config.py), which names their new
spelling.
"""
from __future__ import annotations

import argparse
from functools import cache

from commands import add_checkpoint, add_out, command_parser, option_names, renamed
from errors import ConfigError
from model.fields import toml_value
from train.config import check_names, check_override, read_toml, section_keys, suggest_override

# Where the dataclass of each section but [model] is declared (train/config.py's SECTION_CLASSES;
# tests/test_did_you_mean.py checks the two agree): modules that import torch, so their fields are read from the source.

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
    """(args, overrides): the command line parsed and its names checked (the overrides' and the --config file's);
    the shorthands become overrides after those given as --section.key=value."""
    args, overrides = parser.parse_known_args(argv)
    check_arguments(overrides, parser)
    if args.config is not None:
        check_names(read_toml(args.config), str(args.config), config_keys())
    if args.data is not None:
        overrides.append(f"--{args.data_key}={toml_value(args.data)}")
    if args.out is not None:
        overrides.append(f"--out.dir={toml_value(args.out)}")
    if args.overwrite:
        overrides.append("--out.overwrite=true")
    return args, overrides


@cache
def config_keys() -> dict[str, tuple[str, ...]]:
    """Section -> the keys it takes, for every section of a run config (train/config.py imports no torch)."""
    return {section: tuple(keys) for section, keys in section_keys().items()}


def check_arguments(extras: list[str], parser: argparse.ArgumentParser) -> None:
    """What argparse left (`extras`) must be overrides of known keys; otherwise a ConfigError with the nearest flag
    or key, the value that followed a flag carried over (--max-steps 100 -> --train.max_steps=100)."""
    known = config_keys()
    for index, word in enumerate(extras):
        if word.startswith("--") and "=" in word and "." in word.split("=", 1)[0]:
            check_override(word, known)
            continue
        following = extras[index + 1] if index + 1 < len(extras) and not extras[index + 1].startswith("--") else None
        value = word.split("=", 1)[1] if "=" in word else following
        flag = word.split("=", 1)[0]
        if not flag.startswith("-"):
            hint = f"; did you mean --config {word}?" if word.endswith(".toml") else ""
            raise ConfigError(f"unexpected argument {word!r}: {parser.prog} takes its flags (--help) and config keys "
                              f"as --section.key=value{hint}")
        raise ConfigError(f"unknown option {flag}: {parser.prog} takes its flags (--help) and config keys as "
                          f"--section.key=value{suggest_override(flag, value, known, option_names(parser))}")
