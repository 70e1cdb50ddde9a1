"""What each position encoding costs (and each hybrid and inference-time method), on one shape: training tokens/s,
evaluation tokens/s and peak memory at 1x and 16x the trained length, side by side with rope in the same run.

    python -m scripts.encoding_costs             # every encoding and hybrid; writes runs/bench/encoding_costs.{md,json}
    python -m scripts.encoding_costs --variants '[{"position": "fire"}, {"position": "rope", "attention_window": [64]}]'
    python -m scripts.encoding_costs --device cuda --flex-cuda   # on a GPU, FlexAttention on: encoding_costs-cuda-flex.*
    python -m scripts.encoding_costs --recipes --shape '{"n_layers": 6, "dim": 128, "n_heads": 4, "n_kv_heads": 2,
        "max_seq_len": 64}' --out runs/bench/recipes   # the recipes of 2025's models at the recipes preset's shape

The shape is the full comparison preset's (dim 256, 4 layers, 8 heads, 4 KV heads, L = 256, vocabulary 4096; --shape
replaces any of these), random weights and tokens, one torch thread (as one compare worker runs). Each variant runs in a fresh process, so
peaks do not mix:
  - evaluation: one forward (--eval-batch sequences, 1 by default; fp32, inference mode) of k x L tokens each, for
    each k of --lengths, shortest first;
    tokens/s is the median over --repeats forwards after a warm-up forward (FlexAttention compiles there for a
    distance bias at 2x and longer, model/attention/flex.py; scripts.performance.flex_costs sets it against the
    chunked path); peak memory is the process's peak resident memory after that length (it includes the
    interpreter and torch, the same for every variant: compare within a column);
  - training: the train loop's own step (its default precision: bf16 autocast where the CPU supports it; AdamW,
    clipping) at L with --batch sequences; the median tokens/s over --repeats runs of --train-steps steps, after a
    warm-up step;
  - with --compile, the same step under torch.compile (train.compile) too: its first step's time (compilation
    included, with whatever inductor cache the machine has) and the step count after which compiling has paid:
    (first compiled step - an eager step) / (eager step - compiled step).
On --device cuda the same is timed on the GPU between synchronisations, and the peak is torch.cuda's peak
allocated memory after that length; --flex-cuda builds the models with model.attention_backend = "flex" (FlexAttention for
the bias encodings on CUDA, in training too: model/attention/registry.py), so a run with and one without it set the two paths side by side.
All variants are measured --rounds times, the order rotating from round to round, and each figure is the median
over the rounds, so a slow moment of the machine does not land on one variant; the ratios to rope are the figures
to quote.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from commands import add_device, add_out, command_parser, parse
from errors import ConfigError, cli_command
from model.config import ModelConfig
from model.recipes import RECIPES, expand
from model.runtime import configure_runtime, resolve_device
from model.transformer import Transformer
from scripts.performance.measure import COST_SHAPE, our_trainer, peak_rss_mib, rotating_rounds, synchronize

CPU = torch.device("cpu")
DEFAULT_VARIANTS = [
    {"position": "rope"}, {"position": "none"}, {"position": "sinusoidal"}, {"position": "learned", "position_args": {"learned": {"clamp": True}}},
    {"position": "alibi"}, {"position": "t5"}, {"position": "shaw"}, {"position": "kerple"},
    {"position": "fire"}, {"position": "xpos"}, {"position": "cope"}, {"position": "rope", "position_args": {"rope": {"fraction": 0.25}}},
    {"position": "rope", "position_args": {"rope": {"p": 0.75}}}, {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"]},
    {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"], "attention_window": [64, 64, 64, 0]},
    {"position": "rope", "attention_methods": [{"method": "rerope"}, {"method": "logn"}]},
    {"position": "rope", "attention_methods": [{"method": "selfextend", "group": 16}]},
    {"position": "rope", "attention_methods": [{"method": "sinks"}]},
]

RECIPE_VARIANTS = [{"position": "rope"}, {"position": "alibi"}, {"position": "none"},
                   *({"recipe": name} for name in RECIPES)]


def label(settings: dict) -> str:
    """'rope', 'rope, p 0.75', 'rope + rerope+logn', 'recipe-gemma3', ...: the variant as the table names it (an
    encoding's own settings by their names)."""
    if "recipe" in settings:
        return f"recipe-{settings['recipe']}"
    methods = "+".join(m["method"] for m in settings.get("attention_methods", []))
    own = [f"{key} {value}" for args in settings.get("position_args", {}).values() for key, value in args.items()]
    rest = own + [f"{key} {value}" for key, value in settings.items()
                  if key not in ("position", "attention_methods", "position_args")]
    return ", ".join([settings["position"] + (f" + {methods}" if methods else ""), *rest])


def peak_mib(device: torch.device) -> float:
    """The process's peak resident memory (CPU), or torch.cuda's peak allocated memory since the last reset."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mib()


def train_speed(settings: dict, batch: int, train_steps: int, repeats: int, compile_model: bool,
                device: torch.device = CPU, shape: dict = COST_SHAPE) -> dict:
    """The train loop's step on random batches: median tokens/s over `repeats` runs, and the first step's time."""
    tokens = batch * shape["max_seq_len"]
    with tempfile.TemporaryDirectory() as out_dir:
        step, trainer = our_trainer({**shape, **settings}, batch, compile_model, out_dir, device)
        started = time.perf_counter()
        step()  # warm-up (compilation, when compiled)
        synchronize(device)
        first = time.perf_counter() - started
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(train_steps):
                step()
            synchronize(device)
            runs.append(train_steps * tokens / (time.perf_counter() - started))
    return {"tokens_per_s": round(statistics.median(runs)), "first_step_s": round(first, 2),
            "precision": "bf16" if trainer.amp == torch.bfloat16 else "fp32"}


def measure(settings: dict, lengths: list[int], batch: int, train_steps: int, repeats: int,
            compile_model: bool = False, eval_batch: int = 1, device: torch.device = CPU, flex: bool = False,
            shape: dict = COST_SHAPE) -> dict:
    """Evaluation at each multiple of L (shortest first), then training, in this process. The attention paths
    the model took are in the row (FlexAttention or the chunked path, and why)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    built = expand(settings, shape)  # a recipe's settings at this shape
    built = {**built, "attention_backend": "flex"} if flex else built  # the model's settings
    model = Transformer(ModelConfig(**{**shape, **built})).eval().to(device)
    row: dict = {"settings": settings, "label": label(settings), "device": device.type}
    for multiple in sorted(lengths):
        idx = torch.randint(0, shape["vocab_size"], (eval_batch, multiple * shape["max_seq_len"] + 1)).to(device)
        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with torch.inference_mode():
            model(idx[:, :-1], idx[:, 1:])  # warm-up (FlexAttention compiles here for a distance bias: model/attention/flex.py)
            for _ in range(repeats):
                synchronize(device)
                started = time.perf_counter()
                model(idx[:, :-1], idx[:, 1:])
                synchronize(device)
                times.append(time.perf_counter() - started)
        row[f"eval_{multiple}x"] = {"tokens_per_s": round(idx[:, 1:].numel() / statistics.median(times)),
                                    "peak_rss_mib": round(peak_mib(device))}
        row[f"paths_{multiple}x"] = model.attention_paths()
    del model
    if train_steps:
        row["train"] = train_speed(built, batch, train_steps, repeats, False, device, shape)
        if compile_model:
            row["train_compiled"] = compiled = train_speed(built, batch, train_steps, repeats, True, device, shape)
            tokens = batch * shape["max_seq_len"]
            eager_step, compiled_step = tokens / row["train"]["tokens_per_s"], tokens / compiled["tokens_per_s"]
            saved = eager_step - compiled_step
            compiled["break_even_steps"] = round((compiled["first_step_s"] - eager_step) / saved) if saved > 0 else -1
    return row


def median_row(runs: list[dict]) -> dict:
    """One variant's rounds -> its row: each figure the median over the rounds that ran (a failure if none did)."""
    good = [run for run in runs if "error" not in run]
    if not good:
        return runs[0]
    row = {**good[0], "rounds": len(good)}
    for key, value in good[0].items():
        if isinstance(value, dict) and key != "settings":
            row[key] = {**value, **{name: round(statistics.median(run[key][name] for run in good),
                                                2 if isinstance(number, float) else None)
                                    for name, number in value.items() if isinstance(number, (int, float))}}
    return row


def table(rows: list[dict], lengths: list[int]) -> str:
    """Markdown: one row per variant; each speed also as a ratio to rope's (the first rope row)."""
    base = next((row for row in rows if row.get("label") == "rope"), None)

    def cell(row: dict, key: str) -> str:
        value = row[key]["tokens_per_s"]
        ratio = f" ({value / base[key]['tokens_per_s']:.2f}x)" if base and key in base else ""
        return f"{value:,}{ratio}"

    keys = [f"eval_{m}x" for m in sorted(lengths)]
    compiled = any("train_compiled" in row for row in rows)
    head = ["variant", "train tokens/s (x rope)",
            *(["compiled train tokens/s (x eager)", "first compiled step s", "compile pays after (steps)"]
              if compiled else []),
            *[f"eval {k[5:]} tokens/s (x rope)" for k in keys], *[f"peak MiB, eval {k[5:]}" for k in keys]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {label(row['settings'])} | failed: {row['error']} |" + " |" * (len(head) - 2))
            continue
        train = cell(row, "train") if "train" in row else "n/a"
        if compiled:
            fast = row.get("train_compiled")
            train += " | " + (" | ".join([
                f"{fast['tokens_per_s']:,} ({fast['tokens_per_s'] / row['train']['tokens_per_s']:.2f}x)",
                f"{fast['first_step_s']}",
                f"{fast['break_even_steps']:,}" if fast["break_even_steps"] >= 0 else "never"]) if fast else "n/a | |")
        lines.append(f"| {row['label']} | {train} | " + " | ".join(cell(row, k) for k in keys) + " | "
                     + " | ".join(f"{row[k]['peak_rss_mib']:,}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.encoding_costs", __doc__)
    parser.add_argument("--variants", help="a JSON list of model settings (default: every encoding and hybrid); a "
                        'dict {"recipe": NAME} is a recipe of model/recipes.py at the shape')
    parser.add_argument("--recipes", action="store_true", help="the variants are rope, alibi, none and every recipe of "
                        "2025's open models (model/recipes.py), scaled to the shape")
    parser.add_argument("--shape", help='JSON model settings over the default shape, e.g. {"n_layers": 6}')
    parser.add_argument("--lengths", default="1,16", help="evaluation lengths as multiples of L = 256")
    parser.add_argument("--batch", type=int, default=8, help="training sequences per step")
    parser.add_argument("--train-steps", type=int, default=4, help="training steps per timed run (0: no training)")
    parser.add_argument("--eval-batch", type=int, default=1, help="sequences per evaluation forward")
    parser.add_argument("--compile", action="store_true", help="also train under torch.compile: its speed, first "
                        "step and break-even step count")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per figure in one process (median)")
    parser.add_argument("--rounds", type=int, default=3, help="times every variant is measured, in rotating order "
                                                             "(each figure is the median over rounds)")
    add_device(parser, default="cpu")
    parser.add_argument("--flex-cuda", action="store_true",
                        help='models with model.attention_backend = "flex" (FlexAttention on CUDA, in training too)')
    add_out(parser, "folder for encoding_costs.md and encoding_costs.json (on CUDA: encoding_costs-cuda.*, and "
                    "encoding_costs-cuda-flex.* with --flex-cuda)", type=Path, default=Path("runs/bench"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this JSON settings dict here
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    device = resolve_device(args.device)
    try:
        given = json.loads(args.shape) if args.shape else {}
    except json.JSONDecodeError as error:
        raise ConfigError(f"--shape must be a JSON dict of model settings ({error})") from error
    if not isinstance(given, dict):
        raise ConfigError(f'--shape must be a JSON dict of model settings, e.g. {{"n_layers": 6}}, got {given!r}')
    shape = {**COST_SHAPE, **given}
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {args.device}: encoding_costs times the CPU or a CUDA GPU, not {device.type}")
    try:
        lengths = [int(value) for value in args.lengths.split(",")]
    except ValueError as error:
        raise ConfigError(f"--lengths is a comma-separated list of integers ({error})") from error
    if not lengths or min(lengths) < 1 or min(args.batch, args.eval_batch) < 1 or args.train_steps < 0 or \
            min(args.repeats, args.rounds) < 1:
        raise ConfigError("--lengths >= 1, --batch and --eval-batch >= 1, --train-steps >= 0, --repeats >= 1 and "
                          "--rounds >= 1")
    if args.one is not None:
        print(json.dumps(measure(json.loads(args.one), lengths, args.batch, args.train_steps, args.repeats,
                                 args.compile, args.eval_batch, device, args.flex_cuda, shape)), flush=True)
        return 0
    try:
        variants = json.loads(args.variants) if args.variants else \
            RECIPE_VARIANTS if args.recipes else DEFAULT_VARIANTS
    except json.JSONDecodeError as error:
        raise ConfigError(f"--variants must be a JSON list of settings dicts ({error})") from error
    if not isinstance(variants, list) or not all(isinstance(v, dict) and ("position" in v or "recipe" in v)
                                                 for v in variants):
        raise ConfigError('--variants must be a JSON list of settings dicts, each with a "position" or a "recipe"')
    measured: list[list[dict]] = [[] for _ in variants]
    for round_index, index in rotating_rounds(len(variants), args.rounds):
        settings = variants[index]
        result = subprocess.run([sys.executable, "-m", "scripts.encoding_costs", "--lengths", args.lengths,
                                 "--shape", json.dumps(shape), "--batch", str(args.batch), "--train-steps",
                                 str(args.train_steps), "--repeats",
                                 str(args.repeats), "--eval-batch", str(args.eval_batch), "--device", device.type,
                                 *(["--compile"] if args.compile else []),
                                 *(["--flex-cuda"] if args.flex_cuda else []), "--one",
                                 json.dumps(settings)], capture_output=True, text=True)
        if result.returncode != 0:
            row = {"settings": settings, "error": (result.stderr.strip().splitlines() or ["?"])[-1][:200]}
        else:
            row = json.loads(result.stdout.strip().splitlines()[-1])
        measured[index].append(row)
        print(f"round {round_index + 1}/{args.rounds}: " + json.dumps(row), flush=True)
    rows = [median_row(runs) for runs in measured]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "encoding_costs" + ("-cuda" if device.type == "cuda" else "") + ("-flex" if args.flex_cuda else "")
    named = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    (args.out / f"{stem}.json").write_text(json.dumps({"shape": shape, "lengths": lengths, "batch": args.batch,
                                                       "device": named, "flex_cuda": args.flex_cuda,
                                                       "rounds": args.rounds, "rows": rows,
                                                       "all_rounds": measured}, indent=1) + "\n")
    header = f"device: {named}; model.attention_backend {'flex' if args.flex_cuda else 'auto'}\n\n" if device.type == "cuda" else ""
    (args.out / f"{stem}.md").write_text(header + table(rows, lengths))
    print(table(rows, lengths) + f"wrote {args.out / (stem + '.md')} and {args.out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
