"""Attention diagnostics: why an encoding fails past its trained length, read from its attention.

    python -m eval.attention_diagnostics --checkpoint runs/compare_full/runs/rope/seed1 \\
        runs/compare_full/runs/alibi/seed1 --lengths 1x,4x --tokens 16384 --out runs/attention

For each checkpoint and length, the held-out text is cut into windows of that length; every layer computes its
attention explicitly in chunks of query rows (Transformer.with_observer: model/attention/explicit.py), and these
statistics are summed per layer, head and query position i without keeping any (time x time) matrix:

    entropy    -sum_j p_ij ln p_ij (nats): how spread the attention is (ln(i + 1) is uniform over the prefix)
    distance   sum_j p_ij (i - j): the mean distance attended, in tokens
    sink       sum_{j < s} p_ij: the share on the first s tokens of the window (--sink-tokens, 4)
    far        sum_{i - j >= L} p_ij: the share on keys farther back than the trained length L

Writes OUT/results.json, a summary (per checkpoint and length: per layer and head each statistic's mean over
positions < L and >= L, and per layer, averaged over heads, its curve by position in at most 64 bins of equal width,
`positions` holding each bin's centre) and OUT/attention.png (the four statistics by query position, averaged over
layers and heads, one line per checkpoint and length, L marked).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from commands import add_checkpoint, add_device, add_out, comma_list, command_parser, parse, results_json
from data.tokenizer import load_tokenizer
from errors import ConfigError, DataError, cli_command
from eval import figures
from eval.extrapolation import parse_lengths, resolve_length
from eval.heldout import checkpoint_eval_tokens
from eval.stats import t_interval
from model.checkpoint import load_model, trained_length, training_data_dir
from model.runtime import configure_runtime, resolve_device
from model.transformer import Transformer

STATISTICS = ("entropy", "distance", "sink", "far")
BINS = 64  # the curves by position are kept in at most this many bins: a summary, not the per-position arrays


def pattern_statistics(probs: torch.Tensor, query_start: int, keys: slice, trained: int,
                       sink_tokens: int) -> dict[str, torch.Tensor]:
    """The statistics of attention probabilities `probs` (..., rows, keys) for queries at window positions
    query_start.. and the keys `keys` of the window: each (..., rows), in float64."""
    probs = probs.double()
    rows = probs.shape[-2]
    query = torch.arange(query_start, query_start + rows, device=probs.device)[:, None]
    key = torch.arange(keys.start or 0, (keys.start or 0) + probs.shape[-1], device=probs.device)[None, :]
    distance = (query - key).clamp(min=0).double()  # hidden keys (j > i) carry p = 0
    logs = torch.where(probs > 0, torch.log(probs.clamp(min=1e-300)), torch.zeros_like(probs))
    return {
        "entropy": -(probs * logs).sum(-1),
        "distance": (probs * distance).sum(-1),
        "sink": (probs * (key < sink_tokens)).sum(-1),
        "far": (probs * (distance >= trained)).sum(-1),
    }


class StatisticsObserver:
    """Sums each statistic over windows, per (layer, head, query position)."""

    def __init__(self, layers: int, heads: int, length: int, trained: int, sink_tokens: int) -> None:
        self.sums = {name: torch.zeros(layers, heads, length, dtype=torch.float64) for name in STATISTICS}
        self.trained = trained
        self.sink_tokens = sink_tokens
        self.windows = 0

    def __call__(self, layer: int, rows: slice, keys: slice, probs: torch.Tensor) -> None:
        for name, values in pattern_statistics(probs, rows.start, keys, self.trained, self.sink_tokens).items():
            self.sums[name][layer, :, rows] += values.sum(0).cpu()  # (heads, rows), summed over the batch

    def means(self) -> dict[str, np.ndarray]:
        """(layers, heads, length) means over the windows seen."""
        return {name: (values / max(1, self.windows)).numpy() for name, values in self.sums.items()}


@torch.inference_mode()
def attention_statistics(model: Transformer, ids: np.ndarray, length: int, max_tokens: int,
                         sink_tokens: int = 4, batch_tokens: int = 8192) -> dict[str, np.ndarray]:
    """The four statistics (layers, heads, length) of `model` on nonoverlapping windows of `length` tokens of
    `ids` (at most max_tokens tokens in all)."""
    count = min(len(ids) // length, max(1, max_tokens // length))
    if count < 1:
        raise DataError(f"{len(ids)} evaluation tokens are fewer than one window of {length}")
    config = model.config
    trained = config.max_seq_len
    observer = StatisticsObserver(config.n_layers, config.n_heads, length, trained, sink_tokens)
    observed = model.with_observer(observer)  # a view whose attention is computed explicitly, observed
    device = next(model.parameters()).device
    windows = torch.from_numpy(np.asarray(ids[: count * length], dtype=np.int64).reshape(count, length))
    per_batch = max(1, batch_tokens // length)
    model.eval()
    for first in range(0, count, per_batch):
        rows = windows[first : first + per_batch].to(device)
        observed(rows)
        observer.windows += rows.shape[0]
    return observer.means()


def binned(curves: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, np.ndarray]:
    """(..., length) values by position -> their means over at most `bins` runs of ceil(length / bins) positions
    (the last run may be shorter), and each run's centre position."""
    length = curves.shape[-1]
    width = -(-length // bins)
    starts = np.arange(0, length, width)
    sums = np.add.reduceat(curves, starts, axis=-1)
    sizes = np.diff(np.append(starts, length))
    return sums / sizes, starts + (sizes - 1) / 2


def summarise(means: dict[str, np.ndarray], trained: int) -> dict[str, Any]:
    """Per layer and head the mean within L and beyond it (from every position), and by position per layer,
    averaged over heads, in at most BINS bins (`positions`: each bin's centre)."""
    summary: dict[str, Any] = {}
    for name, values in means.items():
        within, beyond = values[:, :, :trained], values[:, :, trained:]
        curves, positions = binned(values.mean(axis=1))
        summary[name] = {
            "by_position": curves.round(6).tolist(),
            "positions": positions.tolist(),
            "within_L": within.mean(axis=2).round(6).tolist(),
            "beyond_L": beyond.mean(axis=2).round(6).tolist() if beyond.shape[2] else None,
        }
    return summary


def curve(statistic: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(positions, values averaged over layers) of one statistic's summary; a summary written before the curves
    were binned (one value per position) is binned here."""
    values = np.asarray(statistic["by_position"]).mean(axis=0)
    if "positions" in statistic:
        return np.asarray(statistic["positions"]), values
    values, positions = binned(values)
    return positions, values


def over_seeds(rows: list[dict[str, Any]], item: str) -> dict[str, Any]:
    """Each statistic of the models of one variant (their summarise() at one length, one per seed) over the seeds:
    the mean within L and beyond L (over layers, heads and positions) and its rise, each a t interval over seeds."""
    found: dict[str, Any] = {}
    kept = [row[item] for row in rows if "error" not in row.get(item, {"error": 1})]
    for name in STATISTICS:
        for part in ("within_L", "beyond_L"):
            found[f"{name} {part}"] = t_interval([float(np.mean(r[name][part])) for r in kept
                                                  if r[name][part] is not None])
        found[f"{name} rise"] = t_interval([float(np.mean(r[name]["beyond_L"]) - np.mean(r[name]["within_L"]))
                                            for r in kept if r[name]["beyond_L"] is not None])
    return found


def uniform_rise(length: int, trained: int) -> float | None:
    """Mean ln(i + 1) over positions L..T-1 minus over 0..L-1: the entropy rise of uniform causal attention, what
    more keys alone cause (None within L)."""
    logs = np.log(np.arange(1, length + 1))
    return None if length <= trained else float(logs[trained:].mean() - logs[:trained].mean())


def mean_curves(rows: list[dict[str, Any]], item: str) -> dict[str, Any]:
    """The seeds' curves by position at one length averaged, as one summary (what plot draws)."""
    kept = [row[item] for row in rows if "error" not in row.get(item, {"error": 1})]
    return {name: {"by_position": np.mean([np.asarray(r[name]["by_position"]) for r in kept], axis=0).tolist(),
                   "positions": kept[0][name]["positions"]} for name in STATISTICS} if kept else {}


def checkpoint_label(checkpoint: str) -> str:
    """A checkpoint's name in tables and plots: its folder, or for a comparison's OUT/runs/ENCODING/seedS,
    ENCODING/seedS."""
    path = Path(checkpoint)
    return f"{path.parent.name}/{path.name}" if path.name.startswith("seed") else path.name


def plot(results: dict[str, Any], out: Path) -> Path:
    figure, axes = figures.new(4, width=18, height=4)
    titles = {"entropy": "entropy (nats)", "distance": "mean distance attended (tokens)",
              "sink": "share on the first tokens", "far": "share on keys farther than L"}
    # One colour per encoding when each checkpoint has its own (eval/figures.py), else the default cycle; one line
    # style per length (solid: the longest).
    by_encoding = len({entry["position"] for entry in results.values()}) == len(results)
    styles = ["-", "--", ":", "-."]
    for label, entry in results.items():
        lengths = list(entry["lengths"])
        for index, (length, row) in enumerate(entry["lengths"].items()):
            style = {"linestyle": styles[(len(lengths) - 1 - index) % len(styles)]}
            if by_encoding:
                style["color"] = figures.colour(entry["position"])
            for axis, name in zip(axes, STATISTICS):
                axis.plot(*curve(row[name]), linewidth=1, label=f"{label} @ {length}", **style)
    trained = {entry["trained"] for entry in results.values()}
    for axis, name in zip(axes, STATISTICS):
        for value in trained:
            axis.axvline(value, color="grey", linestyle=":", linewidth=1)
        axis.set_title(titles[name])
        axis.set_xlabel(f"query position (in at most {BINS} bins)")
    return figures.save(figure, out / "attention.png", axes[0], below=True)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.attention_diagnostics", __doc__)
    add_checkpoint(parser, "one or more checkpoint folders (required)", nargs="+")
    parser.add_argument("--lengths", default="1x,4x", help="comma-separated multiples of the trained length (4x) or "
                                                           "token counts (1024)")
    parser.add_argument("--data", help="prepared folder, source or path (default: each checkpoint's own held-out "
                                       "val.bin); a raw source that is the checkpoint's training source keeps only "
                                       "its held-out documents, any other is scored whole")
    parser.add_argument("--all-documents", action="store_true",
                        help="raw --data that is the checkpoint's training source: score every document, training "
                             "documents included")
    parser.add_argument("--tokens", type=int, default=16384, help="tokens of held-out text per length")
    parser.add_argument("--sink-tokens", type=int, default=4, help="how many first tokens count as the sink")
    add_device(parser)
    add_out(parser, "output folder: results.json, attention.png (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "out")
    if args.tokens < 1 or args.sink_tokens < 0:
        raise ConfigError("--tokens must be positive and --sink-tokens >= 0")
    lengths = parse_lengths(",".join(comma_list(args.lengths)))
    device = resolve_device(args.device)
    results: dict[str, Any] = {}
    for checkpoint in args.checkpoint:
        model = load_model(checkpoint, device)
        trained = trained_length(checkpoint)
        tokenizer = load_tokenizer(checkpoint)
        data = args.data or training_data_dir(checkpoint)
        ids, scored = checkpoint_eval_tokens(data, checkpoint, tokenizer, all_documents=args.all_documents)
        print(f"{checkpoint}: {scored}")
        entry: dict[str, Any] = {"checkpoint": str(checkpoint), "position": model.config.position,
                                 "trained": trained, "lengths": {}}
        for item in lengths:
            length = resolve_length(item, trained)
            means = attention_statistics(model, ids, length, args.tokens, args.sink_tokens)
            entry["lengths"][item] = summarise(means, trained)
            entropy = means["entropy"].mean(axis=(0, 1))
            shown = f", beyond L {entropy[trained:].mean():.3f}" if length > trained else ""
            print(f"{checkpoint} @ {item} ({length} tokens): entropy within L {entropy[:trained].mean():.3f}{shown} "
                  f"nats; far share {means['far'].mean():.3f}; sink share {means['sink'].mean():.3f}")
        results[checkpoint_label(checkpoint)] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(results_json(results))
    print(f"wrote {args.out / 'results.json'} and {plot(results, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

