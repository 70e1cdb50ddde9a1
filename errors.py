"""The one user-error type, at the bottom of the import graph (every layer may import it; it imports nothing).

A UserError is bad input: a flag, a config value, a file or a folder that is missing, malformed or does not fit.
Its message names the problem and what to do. Every command (`cli_command`) prints it as one line and exits 2.
A CommandStopped is a command that stopped short and says why (a training interrupted by Ctrl-C, a non-finite loss):
one line too, and its own exit code. Any other exception is a bug in pelab (or the environment) and keeps its
traceback.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable


class UserError(Exception):
    """Bad input, reported to the user as one line (exit code 2)."""


class ConfigError(UserError):
    """A config value or command-line flag that is invalid or inconsistent."""


class SourceError(UserError):
    """A text source that cannot be read: unknown name, unreachable hub, undecodable or empty file."""


class DataError(UserError):
    """Prepared data (token files, a tokenizer) that is missing or too small for the request."""


class CheckpointError(UserError):
    """A checkpoint folder that is missing, incomplete, corrupted or does not match its config."""


class PositionRangeError(UserError):
    """A position past what the encoding can represent (e.g. beyond a learned table)."""


class ConversationError(UserError):
    """An SFT conversation that does not follow the chat format."""


class ConversionError(UserError):
    """A model that cannot be converted to or from transformers' Llama."""


class CommandStopped(Exception):
    """A command that stopped short, keeping what it wrote (an interrupted training, a non-finite loss): reported
    as one line (after `prefix`), the process exiting with `exit_code`."""

    exit_code = 1
    prefix = "error: "


def cli_command(main: Callable[[list[str] | None], int]) -> Callable[[list[str] | None], int]:
    """Wrap an entry point's main(argv): a UserError becomes "error: ..." on stderr and exit code 2, a
    CommandStopped its own line and exit code."""

    @functools.wraps(main)
    def run(argv: list[str] | None = None) -> int:
        try:
            return main(argv)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except CommandStopped as stop:
            print(f"{stop.prefix}{stop}", file=sys.stderr)
            return stop.exit_code

    return run
