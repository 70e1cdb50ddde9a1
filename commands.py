"""The command-line convention every entry point follows (docs/guide/commands.md).

One name for one thing in every command: --checkpoint (a checkpoint folder to read), --data (data to read: a
prepared folder, a named source or a text path), --out (the output folder), --length / --lengths (token counts,
or multiples of the trained length like 4x), --tokens (how many tokens to score), --device, --dtype, --seed,
--overwrite, and for commands that train, --config FILE plus --section.key=value overrides. Lists are
comma-separated. --help shows every default. A former spelling is refused with the name that replaced it, and a
misspelled flag, key, folder or name with the nearest one ("did you mean ..."; `did_you_mean`, `nearby_folder`).
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path
from typing import Any, Callable, Iterable

# How close a suggestion must be (difflib's ratio: 2 x matching characters / total characters), as pip's and git's
# "did you mean" are: a letter or two off in a short name, a word off in a long one.
CLOSE = 0.6


def nearest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to `word` by edit similarity, or None when none is close (the one "did you mean" of every
    command and config loader)."""
    found = difflib.get_close_matches(word, list(dict.fromkeys(choices)), n=1, cutoff=CLOSE)
    return found[0] if found else None


def did_you_mean(word: str, choices: Iterable[str], shown: Callable[[str], str] = str) -> str:
    """"; did you mean X?" for the choice nearest to `word` (written by `shown`), or "" when none is close."""
    found = nearest(word, choices)
    return f"; did you mean {shown(found)}?" if found is not None else ""


def nearby_folder(path: str | Path, accept: Callable[[Path], bool]) -> Path | None:
    """The folder beside `path` (in its parent) whose name is nearest to `path`'s and that `accept`s, or None: for a
    misspelled checkpoint or data folder (runs/demoo -> runs/demo)."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        return None
    try:
        folders = {child.name: child for child in parent.iterdir() if child.is_dir() and child.name != path.name}
    except OSError:
        return None
    while folders:
        found = nearest(path.name, folders)
        if found is None:
            return None
        if accept(folders[found]):
            return folders[found]
        del folders[found]
    return None


def portable_command(command: str) -> str:
    """A logged command as a report shows it: each absolute path inside the repository made relative to it, each
    other absolute path (a file of the machine that ran it) as path/to/NAME, so that reports name paths a user has."""
    root = Path(__file__).resolve().parent

    def portable(match: "re.Match[str]") -> str:
        path = Path(match.group(0))
        if path.is_relative_to(root):
            return str(path.relative_to(root)) or "."
        return f"path/to/{path.name}"

    return re.sub(r"(?<![\w.])/(?:[\w.\-]+/)*[\w.\-]+", portable, command)


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string `parser` takes and shows (former spellings, hidden, are left out)."""
    return [flag for action in parser._actions if action.help != argparse.SUPPRESS for flag in action.option_strings]


def suggest_options(words: list[str], parser: argparse.ArgumentParser) -> str:
    """"; did you mean --x?" for arguments `parser` does not take: the nearest option of each unknown flag that has a
    close one (an underscore typed for a hyphen counts as the hyphen), or ""."""
    options = {option.replace("_", "-"): option for option in option_names(parser)}
    found = []
    for word in words:
        flag = word.split("=", 1)[0]
        match = nearest(flag.replace("_", "-"), options) if flag.startswith("--") else None
        if match is not None:
            found.append((flag, options[match]))
    if not found:
        return ""
    if len(found) == 1:
        return f"; did you mean {found[0][1]}?"
    return "; did you mean " + ", ".join(f"{option} for {flag}" for flag, option in found) + "?"


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, whose "unrecognized arguments" names the nearest option of each unknown one."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{suggest_options(extras, self)}")
        return parsed


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and "(default: ...)" after every option that has a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or default in (None, False, argparse.SUPPRESS) or default == [] or \
                not action.option_strings:
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else "%(default)s"
        return f"{text} (default: {shown})"


def command_parser(module: str, description: str | None, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of `python -m MODULE` (its usage line names the command as it is typed)."""
    return CommandParser(prog=f"python -m {module}", description=description, epilog=epilog,
                         formatter_class=HelpFormatter)


class Renamed(argparse.Action):
    """An option's former name: refused with the name that replaced it (exit 2, nothing run)."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} was renamed: use {self.new}")


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Refuse `old`, a former spelling, naming `new` (hidden from --help)."""
    parser.add_argument(old, dest=f"renamed_{old.lstrip('-').replace('-', '_')}", action=Renamed, new=new,
                        nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def parse(parser: argparse.ArgumentParser, argv: list[str] | None, *required: str) -> argparse.Namespace:
    """A command's arguments: `argv` (None: the command line) parsed, with the options named in `required` checked
    as argparse's `required` would (`require`)."""
    args = parser.parse_args(argv)
    require(parser, args, *required)
    return args


def require(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """argparse's `required`, checked after parsing (for commands whose options are also read from a config)."""
    missing = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name, None) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")


def comma_list(values: str | list[str] | None) -> list[str]:
    """'a,b' (or, for options that took space-separated values before, ['a', 'b,c']) -> ['a', 'b', 'c']."""
    if values is None:
        return []
    parts = [values] if isinstance(values, str) else list(values)
    return [item.strip() for part in parts for item in part.split(",") if item.strip()]


def add_checkpoint(parser: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    parser.add_argument("--checkpoint", metavar="DIR", help=help, **kwargs)


def add_out(parser: argparse.ArgumentParser, help: str = "output folder", **kwargs: Any) -> None:
    parser.add_argument("--out", metavar="DIR", help=help, **kwargs)


def add_device(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    parser.add_argument("--device", default=default, help="auto | cpu | cuda | mps")


RESULTS_DIGITS = 9  # significant digits of a float in a results file: every float32 reads back exactly


def results_json(record: Any, exact: bool = False) -> str:
    """A command's results file (OUT/results.json): JSON indented by one space, with each innermost record (an
    object or list holding only numbers, strings, booleans, nulls and lists of them) on one line, and floats to
    RESULTS_DIGITS significant digits (exact: every float as it is). A file a reader can page through and diff by
    record; json.loads reads it."""
    return _compact(record, 0, exact) + "\n"


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.{RESULTS_DIGITS}g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value


def _flat(value: Any) -> bool:
    """A scalar, or a list or object of scalars and lists of scalars: written on one line."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        return True
    return all(not isinstance(item, (dict, list, tuple)) or (not isinstance(item, dict) and
               all(not isinstance(inner, (dict, list, tuple)) for inner in item)) for item in items)


def _compact(value: Any, level: int, exact: bool = False) -> str:
    if _flat(value):
        return json.dumps(value if exact else _rounded(value))
    inner, outer = " " * (level + 1), " " * level
    if isinstance(value, dict):
        parts = [f"{inner}{json.dumps(key if isinstance(key, str) else json.dumps(key))}: "
                 f"{_compact(item, level + 1, exact)}" for key, item in value.items()]
        return "{\n" + ",\n".join(parts) + "\n" + outer + "}"
    return "[\n" + ",\n".join(f"{inner}{_compact(item, level + 1, exact)}" for item in value) + "\n" + outer + "]"
