"""`python -m experiments.compare`: the command is experiments/compare/cli.py (its --help is that module's docstring)."""
import sys

from experiments.compare.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
