"""Train one model per position encoding and seed with identical budgets, evaluate them context-matched at
1x..16x the trained context, and write a report with intervals over seeds.

    python -m experiments.compare --config configs/compare.toml --preset quick
    python -m experiments.compare --config configs/compare.toml --preset full                     # PG-19, from the hub
    python -m experiments.compare --config configs/compare.toml --preset full --compare.source=PATH   # local books

Every variant shares the data, token budget, shape and context length L; for each seed in compare.seeds it also
shares the initialisation seed and the data order; only the position settings differ (model.position, or
the model settings of a variant in compare.variants, e.g. a RoPE/NoPE layer hybrid). Each trained model is evaluated
as trained and under each inference-time method in compare.methods that applies to it (model/methods/), on the
same held-out tokens at every length, with the L-window reference and the position-shift probe
(eval/extrapolation.py); compare.snapshots also evaluates the models kept at those fractions of training.
Jobs (one per encoding and seed) run in compare.workers processes; each writes OUT/logs/ENCODING-seedS.log.
Re-running skips what is done (trainings resume, evaluations are cached); a job that fails is reported, not
fatal. Writes OUT/report.md, results.json, table.md and the plots (experiments/compare/report.py). Optional sections
beyond perplexity: compare.probes (attention diagnostics, the induction probe, passkey retrieval, on every model)
and compare.tasks (the synthetic task suite, trained per encoding); see experiments/compare/probes.py.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from commands import add_out, command_parser, suggest_options
from data.batches import open_split
from errors import ConfigError, cli_command
from experiments.compare.config import CompareConfig, load_compare_config
from experiments.compare.probes import run_tasks
from experiments.compare.report import write_outputs
from experiments.compare.results import Invocation, gather
from experiments.compare.running import (
    Job,
    check_existing_data,
    check_existing_runs,
    largest_first,
    prepared_data,
    record_jobs,
    run_jobs,
    variant_config,
)
from experiments.compare.use import check_use_windows
from experiments.jobs import machine_description, worker_layout
from model.folder_lock import FolderLock
from train.trackers import log_summary


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m experiments.compare` (its description is this module's docstring)."""
    parser = command_parser("experiments.compare", __doc__, epilog="Overrides: --compare.key=value (lists comma-separated, "
                                                            "e.g. --compare.encodings=rope,alibi --compare.seeds=1,2), "
                                                            "--model.key=value, --train.key=value")
    parser.add_argument("--config", type=Path, default=Path("configs/compare.toml"), metavar="FILE",
                        help="TOML compare config")
    parser.add_argument("--preset", help="a [presets.NAME] table of the config: quick, newer, frontier, frontier2, "
                        "full, wikitext103 or gpu (docs/presets.md: what each answers and costs)")
    add_out(parser, "output folder (default: compare.out of the config)")
    return parser


def experiment_arguments(parser: argparse.ArgumentParser, argv: list[str] | None
                         ) -> tuple[argparse.Namespace, list[str], str]:
    """An experiment's arguments (experiments.compare, ladder, sweep): its own flags, the --compare., --model.,
    --train. and --runtime. overrides for every comparison it runs (any other argument is refused), and the command
    as typed, for its report."""
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if not o.startswith(("--compare.", "--model.", "--train.", "--runtime.")) or "=" not in o]
    if bad:
        raise ConfigError(f"unknown arguments {bad}: {parser.prog} takes the flags of its --help and "
                          "--compare.key=value, --model.key=value, --train.key=value, --runtime.key=value overrides"
                          f"{suggest_options(bad, parser)}")
    # compare.reuse copies models that the settings given would train to the same bytes: it changes no number, so
    # the command a report gives to reproduce it leaves it out (the folders it names are this machine's).
    typed = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--compare.reuse=")]
    command = " ".join([parser.prog, *map(shlex.quote, typed)])
    return args, overrides, command


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides, command = experiment_arguments(build_parser(), argv)
    if args.out:
        overrides.append(f"--compare.out={args.out}")
    started = time.perf_counter()
    compare, shared, preset = load_compare_config(args.config, args.preset, overrides)
    with FolderLock(Path(compare.out), "comparison"):  # one per folder; its trainings lock their own run folders
        return run_comparison(compare, shared, preset, command, started)


def run_comparison(compare: CompareConfig, shared: dict, preset: str, command: str, started: float) -> int:
    """Train, evaluate and probe every variant x seed (what is not done yet), run the task suite, and write the
    report in compare.out. 0 when every job succeeded, 1 otherwise."""
    out = Path(compare.out)
    check_existing_data(compare)
    data_dir = prepared_data(compare)
    configs = {(encoding, seed): variant_config(shared, encoding, seed, data_dir, compare)
               for seed in compare.seeds for encoding in compare.encodings}
    check_existing_runs(configs)
    held_out = len(open_split(data_dir, "val").tokens)
    for trained in sorted({config.model.max_seq_len for config in configs.values()}):
        check_use_windows(compare, trained, held_out)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    workers, threads = worker_layout(compare.workers, len(configs), gpus, compare.threads)
    jobs = [Job(encoding, seed, config.to_dict(), asdict(compare), threads)
            for (encoding, seed), config in configs.items()]
    results = run_jobs(largest_first(jobs, configs), workers, out, adapt_threads=not compare.threads)
    if compare.tasks:
        try:
            run_tasks(compare, out, shared.get("model", {}))
        except Exception as error:  # the perplexity report is still written
            traceback.print_exc()
            print(f"the task suite failed ({type(error).__name__}: {error}); the report leaves it out",
                  file=sys.stderr)
    wall = time.perf_counter() - started
    record_jobs(out, command, wall, workers, threads, results)
    if all(str(result["status"]).startswith("failed") for result in results.values()) and (out / "report.md").exists():
        print(f"\nevery job failed (see {out / 'logs'}); the previous report in {out} is kept", file=sys.stderr)
        return 1
    invocation = Invocation(command, wall, preset, workers, threads, machine_description())
    write_outputs(gather(compare, shared, configs, results, invocation))
    first = next(iter(configs.values())).train
    if [name for name in first.report_to if name != "jsonl"]:
        cells = json.loads((out / "results.json").read_text())["cells"]
        log_summary(first.report_to, out, first.tracker_group, (out / "table.md").read_text(),
                    {f"{c['label']}/ppl_{c['multiple']:g}x": c["ppl"]["mean"] for c in cells if c["ppl"]})
    print(f"\nwrote {out / 'report.md'} ({wall / 60:.1f} min)")
    return 0 if all(not r["status"].startswith("failed") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
