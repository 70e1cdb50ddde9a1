"""Does a model put attention on its first token beyond what uniform attention would (an attention sink), and does a
design remove it? Read from eval.attention_diagnostics' results, across the seeds of each variant.

    python -m eval.attention_diagnostics --checkpoint runs/compare_recipes/runs/{rope,recipe-gated}/seed{1,2,3} \\
        --lengths 1x,4x --sink-tokens 1 --tokens 8192 --out runs/attention_sinks
    python -m experiments.sink_share runs/attention_sinks/results.json

For each variant (the checkpoints ENCODING/seedS of one ENCODING) and length: each layer's share of attention on the
first token (--sink-tokens 1), averaged over the queries from --from-position on (queries 0-15 see few keys, so any
share there is large), then the mean over layers and the largest layer, each with a 95% t interval over seeds
clipped to [0, 1]; beside them the share uniform attention over the prefix would give, 1 / (i + 1) averaged over the
same queries. A sink is a share well above uniform (trained models' sinks take 30-90% of the mass in some layers).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from commands import command_parser, parse
from errors import ConfigError, cli_command
from eval.stats import bounded_t_interval


def shares(results: dict, start: int) -> dict[tuple[str, str], dict]:
    """(variant, length) -> per seed the layers' mean first-token share over queries at positions >= start, and the
    uniform share over those queries."""
    found: dict[tuple[str, str], dict] = defaultdict(lambda: {"layers": [], "uniform": None})
    for label, entry in results.items():
        variant = label.rsplit("/", 1)[0] if label.rsplit("/", 1)[-1].startswith("seed") else label
        for length, statistics in entry["lengths"].items():
            sink = statistics.get("sink")
            if sink is None:
                continue
            positions, curves = np.asarray(sink["positions"]), np.asarray(sink["by_position"])
            keep = positions >= start
            if not keep.any():
                continue
            cell = found[(variant, length)]
            cell["layers"].append(curves[:, keep].mean(axis=1))
            cell["uniform"] = float(np.mean(1 / (positions[keep] + 1)))
    return dict(found)


def table(found: dict[tuple[str, str], dict]) -> str:
    lines = ["| variant | length | seeds | first-token share, mean over layers | largest layer | uniform |",
             "|---|---|---:|---|---|---:|"]
    for (variant, length), cell in sorted(found.items(), key=lambda item: (item[0][1], item[0][0])):
        layers = cell["layers"]
        mean = bounded_t_interval([float(values.mean()) for values in layers], 0.0, 1.0)
        top = bounded_t_interval([float(values.max()) for values in layers], 0.0, 1.0)
        lines.append(f"| {variant} | {length} | {len(layers)} | {mean.format(4)} | {top.format(4)} | "
                     f"{cell['uniform']:.4f} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.sink_share", __doc__)
    parser.add_argument("results", type=Path, help="results.json of eval.attention_diagnostics (--sink-tokens 1)")
    parser.add_argument("--from-position", type=int, default=16,
                        help="the first query position averaged over (at a longer length: max(this, L))")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if not args.results.is_file():
        raise ConfigError(f"{args.results} is not a file: give the results.json eval.attention_diagnostics wrote")
    results = json.loads(args.results.read_text())
    trained = {entry["trained"] for entry in results.values()}
    start = max(args.from_position, 0)
    found = {key: cell for key, cell in shares(results, start).items() if key[1] == "1x"}
    if trained and max(trained) > start:
        found.update({key: cell for key, cell in shares(results, max(trained)).items() if key[1] != "1x"})
    print(table(found), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
