"""The command line of the training commands (train.pretrain, train.sft, train.extend), checked before torch loads.

The options every training command shares, and the names of a run config's sections and keys: a misspelled flag, an
override not written as --section.key=value, or a key that no section has, in an override or in the --config file,
is refused at once, with the nearest name ("did you mean --train.max_steps=100?"), before the command imports torch
and the model (which take seconds). The names are the config dataclasses' fields (`config_keys`): [model]'s are
ModelConfig's own (model/config.py imports no plug-in and not torch); the other sections' are read from their source
while train/config.py imports model/runtime.py, and with it torch. The [model] keys of configs written before
model.position_args (model/legacy_keys.py) are left to the full check (train/config.py), which names their new
spelling.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Collection

from commands import add_checkpoint, add_out, command_parser, nearest, option_names, renamed
from errors import ConfigError
from model.config import ModelConfig
from model.fields import toml_value
from model.legacy_keys import LEGACY_KEYS

# Where the dataclass of each section but [model] is declared (train/config.py's SECTION_CLASSES;
# tests/test_did_you_mean.py checks the two agree): modules that import torch, so their fields are read from the source.
SECTION_SOURCES = {"data": ("train.config", "DataConfig"), "train": ("train.config", "TrainConfig"),
                   "out": ("train.config", "OutConfig"), "runtime": ("model.runtime", "RuntimeConfig")}


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


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML config file's values; a missing or malformed file is a ConfigError naming it."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} not found (see configs/ for examples)")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML ({error})") from error


def declared_fields(module: str, name: str) -> list[str]:
    """The fields of dataclass `name` in `module`, read from its source (annotated names of the class body, ClassVars
    left out) without importing the module."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    body = next(node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)
    return [node.target.id for node in body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and "ClassVar" not in ast.unparse(node.annotation)]


@cache
def config_keys() -> dict[str, tuple[str, ...]]:
    """Section -> the keys it takes, for every section of a run config (read without importing torch)."""
    return {"model": tuple(field.name for field in dataclasses.fields(ModelConfig)),
            **{section: tuple(declared_fields(*where)) for section, where in SECTION_SOURCES.items()}}


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
