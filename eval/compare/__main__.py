"""`python -m eval.compare`: the command is eval/compare/cli.py (its --help is that module's docstring)."""
import sys

from eval.compare.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
