"""Count the two-process (gloo) runs that fail after training: the exit codes of N consecutive torchrun runs.

    python -m experiments.ddp_exits --data runs/data/stdlib --runs 100 --out runs/ddp_exits/head.json
    python -m experiments.ddp_exits --checkout /tmp/baseline --data runs/data/stdlib --runs 100 \
        --out runs/ddp_exits/baseline.json

Each run is `torchrun --standalone --nproc_per_node=2 -m train.pretrain` on a micro model (6 steps, float32, CPU),
into a fresh folder. A run counts as failed when torchrun exits non-zero; the record keeps each failure's exit code
and the last lines of its error output, and whether the run had saved its checkpoint first (the abort at interpreter
exit that issue 76 describes happens after the save). --checkout runs another checkout's code (a git worktree of the
baseline commit); run it on a quiet machine: the race needs idle cores to show.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commands import command_parser

MICRO = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
         "--model.n_kv_heads=2", "--model.max_seq_len=64", "--train.batch_size=4", "--train.max_steps=6",
         "--train.warmup_steps=2", "--train.log_interval=1", "--train.eval_interval=3", "--train.eval_batches=2",
         "--train.dtype=float32", "--train.device=cpu"]


def one_run(data: Path, out: Path, root: Path) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "train.pretrain", f"--data.dir={data}", f"--out.dir={out}", *MICRO]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    started = time.perf_counter()
    finished = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600, env=env)
    return {"returncode": finished.returncode, "seconds": round(time.perf_counter() - started, 2),
            "saved": any(out.glob("*.safetensors")),
            "stderr_tail": finished.stderr[-600:] if finished.returncode else ""}


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.ddp_exits", __doc__)
    parser.add_argument("--data", required=True, help="a prepared data folder (python -m data.prepare)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--checkout", default=".", help="the checkout whose code runs (default: this one)")
    parser.add_argument("--out", required=True, help="the JSON record to write (rewritten after every run)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = Path(args.checkout).resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip()
    record = {"commit": commit, "data": str(args.data), "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for index in range(args.runs):
        folder = Path(tempfile.mkdtemp(prefix="ddp_exit_"))
        try:
            record["runs"].append(one_run(Path(args.data).resolve(), folder / "run", root))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        failed = [run for run in record["runs"] if run["returncode"] != 0]
        record["failed"] = len(failed)
        out.write_text(json.dumps(record, indent=1))
        print(f"run {index + 1}/{args.runs}: exit {record['runs'][-1]['returncode']} "
              f"({record['runs'][-1]['seconds']} s); failed so far {len(failed)}", flush=True)
    print(f"{commit}: {record['failed']} of {args.runs} two-process runs failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
