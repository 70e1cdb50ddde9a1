"""One GPU lease, made to count: the CUDA suite, the bench, the GPU cost table, the gpu preset and the real model,
in that order (of value), each step under its own time limit, each writing its results under OUT as it finishes.

    bash experiments/gpu_lease/session.sh suite        # one step (on the GPU machine, OUT set by the device tool)
    bash experiments/gpu_lease/session.sh bench costs  # several, in the order given
    python -m experiments.gpu_lease.session --dry-run --out runs/gpu_dry   # every step on this CPU, at a micro scale

Steps (docs/performance.md, "GPU session": the `run` calls that issue them, with what each carries):
  suite       tests/test_cuda.py, then the fast tier, whose commands' default device is then CUDA (junit + log each)
  sweep       experiments.sweep: the learning rate of every encoding of the quick and frontier presets (4 values, 2
              seeds) on the carried stdlib preparation of those presets, the comparisons' workers sharing the GPU
  bench       scripts.bench --device cuda at the research shapes, then the tiny one: ours against transformers'
              Llama, eager and compiled, bf16, MFU against the bf16 peak measured with an 8192^3 matmul
  costs       the attention paths with model.attention_backend = "flex", the whole-model cost table with
              FlexAttention on CUDA off and on (scripts.encoding_costs), and one layer's
              (experiments.performance.flex_costs)
  preset      experiments.compare --preset gpu on the carried books: seeds 1-3 (a complete report), then 1-5 with
              the time left; a later call on the same (warm) machine goes on where this one stopped
  real_model  experiments.real_model on SmolLM2-135M at 1x-8x of its context (64k tokens), when the machine has it: an
              imported checkpoint carried as CARRY/smollm2, or the GGUF file in parts (experiments.gpu_lease.carry)

A step's failure or time-out is recorded and the next step runs. Each step's files are packed into OUT/STEP.tar.gz
(text, JSON, logs and figures: no weights, no token files) and OUT/session.json says what ran, how long, and how
each command ended; the device tool returns at most 8 files, so nothing else is written under OUT. The step's own
files stay in WORK/STEP. The carried files (CARRY, default runs/gpu_carry) come from `python -m
experiments.gpu_lease.carry`: wheels of the packages the GPU machine lacks (installed into a private folder first),
the prepared books, a book for the real model, the GGUF parts.

--dry-run goes through the same steps on this CPU at a micro scale (the micro bench shape, the gpu preset with
micro overrides, a micro checkpoint in place of SmolLM2), for tests/test_gpu_session.py.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable

from commands import add_out, comma_list, command_parser, parse
from errors import ConfigError, cli_command

ROOT = Path(__file__).resolve().parents[2]
# Seconds per step. The calls of a lease (docs/performance.md, "GPU session", and experiments/gpu_lease/carry.py's
# CALLS) take one step group each, within a device command's 10 minutes; a 15-minute lease runs two calls, steps side
# by side with --limits. Guesses until measured: a step that reaches its limit returns what it finished.
LIMITS = {"suite": 420, "sweep": 420, "bench": 270, "costs": 150, "preset": 480, "real_model": 240}
STEPS = list(LIMITS)
KEPT = {".md", ".json", ".jsonl", ".xml", ".log", ".txt", ".png", ".svg", ".toml", ".csv"}  # what OUT gets back
UNKEPT = {"tokenizer.json", "tokenizer_config.json"}  # a copy in every run folder
LARGEST_KEPT = 4 * 2**20  # bytes per packed file
LARGEST_ARCHIVE = 15 * 2**20  # the device tool returns files of at most 16 MiB
GRACE_S = 15  # after SIGINT (pytest writes its junit file then), before SIGKILL
MIN_START_S = 5  # a command is not started with less of its step's time left


class StepSkipped(Exception):
    """The step cannot run on this machine (what it needs is not here); the reason says what is missing."""


def run_command(argv: list[str], log: Path, limit_s: float, env: dict | None = None) -> dict:
    """Run argv (its own process group) with stdout and stderr into `log`, at most limit_s seconds: then SIGINT,
    and SIGKILL after GRACE_S. Returns {command, rc, seconds, timed_out, log}."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                   start_new_session=True)
        timed_out = False
        try:
            rc = process.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, wait in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 10)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = process.wait()
    return {"command": " ".join(argv), "rc": rc, "seconds": round(time.perf_counter() - started, 1),
            "timed_out": timed_out, "log": log.name}


def last_lines(path: Path, count: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-count:]) if path.exists() else ""


def pytest_summary(log: Path) -> str:
    """pytest's last summary line in `log` ('3 failed, 410 passed, 9 skipped in 201.5s'), or ''."""
    for line in reversed(log.read_text(errors="replace").splitlines() if log.exists() else []):
        if re.search(r"\d+ (passed|failed|skipped|error|errors|deselected)\b", line):
            return line.strip("= ").strip()
    return ""


def pytest_failures(log: Path) -> list[str]:
    """The test ids reported FAILED or ERROR in `log`, in order and once each: pytest's closing list, or, where the
    run was cut off before it, xdist's verbose lines ('[gw3] [ 40%] FAILED tests/test_flex.py::test_y')."""
    found = re.findall(r"^(?:\[gw\d+\] \[\s*\d+%\] )?(?:FAILED|ERROR) (tests/\S+)",
                       log.read_text(errors="replace") if log.exists() else "", re.MULTILINE)
    return list(dict.fromkeys(found))


def pack(folder: Path, archive: Path) -> dict:
    """folder's text, JSON, logs and figures (KEPT suffixes, each at most LARGEST_KEPT) into archive (tar.gz),
    the largest files left out while the total exceeds LARGEST_ARCHIVE. Returns {files, bytes, left_out}."""
    files = sorted((p for p in folder.rglob("*") if p.is_file() and p.suffix in KEPT and p.name not in UNKEPT),
                   key=lambda p: p.stat().st_size)
    left_out = [str(p.relative_to(folder)) for p in files if p.stat().st_size > LARGEST_KEPT]
    files = [p for p in files if p.stat().st_size <= LARGEST_KEPT]
    while files and sum(p.stat().st_size for p in files) > LARGEST_ARCHIVE:
        left_out.append(str(files.pop().relative_to(folder)))
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(folder.parent)))
    partial.replace(archive)  # a cut-off call never leaves half an archive under its final name
    return {"files": len(files), "bytes": archive.stat().st_size, "left_out": left_out}


class Session:
    """What every step sees: the mode, the folders, and run() for its commands (which share the step's limit)."""

    def __init__(self, out: Path, work: Path, carry: Path, dry: bool, limits: dict[str, float] | None = None,
                 suite_workers: int = 1) -> None:
        self.out, self.work, self.carry, self.dry = out, work, carry, dry
        self.limits = {**LIMITS, **(limits or {})}
        self.suite_workers = suite_workers
        self.python = sys.executable
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.record: dict = {"mode": "dry-run" if dry else "device", "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                             "steps": {}}
        self.step, self.deadline, self.commands = "", 0.0, []

    def folder(self, *parts: str) -> Path:
        path = self.work / self.step / Path(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def run(self, name: str, argv: list[str], limit_s: float | None = None, ok: tuple[int, ...] = (0,)) -> dict:
        """Run one command of the step, within the step's time left (and limit_s if given); print how it ended.
        `ok`: the exit codes that are a success."""
        limit = min(limit_s or self.left(), self.left())
        if limit < MIN_START_S:
            result = {"command": " ".join(argv), "rc": None, "seconds": 0.0, "timed_out": True, "log": "",
                      "note": "not started: the step's time was spent"}
        else:
            result = run_command(argv, self.folder() / f"{name}.log", limit, self.env)
        result["ok"] = result["rc"] in ok and not result["timed_out"]
        summary = pytest_summary(self.folder() / f"{name}.log") if "pytest" in argv else ""
        if summary:
            result["summary"] = summary
        if "pytest" in argv:
            result["failed"] = pytest_failures(self.folder() / f"{name}.log")
        self.commands.append({"name": name, **result})
        ended = ("timed out" if result["timed_out"] else f"exit {result['rc']}") + (f", {summary}" if summary else "")
        print(f"[{self.step}] {name}: {ended} ({result['seconds']:.0f} s)", flush=True)
        if not result["ok"]:
            tail = last_lines(self.folder() / f"{name}.log")
            print("\n".join(f"    {line}" for line in tail.splitlines()), flush=True)
        return result

    def module(self, name: str, module: str, *args: str, limit_s: float | None = None,
               ok: tuple[int, ...] = (0,)) -> dict:
        return self.run(name, [self.python, "-m", module, *args], limit_s, ok)

    def run_step(self, name: str, body: Callable[["Session"], None]) -> dict:
        self.step, self.commands = name, []
        self.deadline = time.perf_counter() + self.limits[name]
        started = time.perf_counter()
        status, reason = "ok", ""
        print(f"[{name}] started (limit {self.limits[name]:.0f} s)", flush=True)
        try:
            body(self)
        except StepSkipped as skipped:
            status, reason = "skipped", str(skipped)
        except Exception as error:  # noqa: BLE001 (a step's failure is recorded; the next step runs)
            status, reason = "failed", f"{type(error).__name__}: {error}"
        if status == "ok" and any(c["timed_out"] for c in self.commands):
            status, reason = "timed out", "a command reached its time limit (its output so far is packed)"
        elif status == "ok" and not all(c["ok"] for c in self.commands):
            status, reason = "failed", "a command failed: " + ", ".join(c["name"] for c in self.commands
                                                                        if not c["ok"])
        (self.folder() / "step.json").write_text(json.dumps({"step": name, "status": status, "reason": reason,
                                                             "commands": self.commands}, indent=1) + "\n")
        packed = pack(self.folder(), self.out / f"{name}.tar.gz")
        entry = {"status": status, "reason": reason, "seconds": round(time.perf_counter() - started, 1),
                 "commands": self.commands, "archive": f"{name}.tar.gz", **packed}
        self.record["steps"][name] = entry
        (self.out / "session.json").write_text(json.dumps(self.record, indent=1) + "\n")
        print(f"[{name}] {status}{': ' + reason if reason else ''} ({entry['seconds']:.0f} s); wrote "
              f"{self.out / entry['archive']}", flush=True)
        return entry

    def setup(self) -> None:
        """On the GPU machine: CUDA must be there, and the carried wheels (packages its image lacks) are installed
        into a private folder that every command's PYTHONPATH starts with."""
        if self.dry:
            return
        probe = subprocess.run([self.python, "-c", "import torch; print(torch.cuda.is_available())"],
                               capture_output=True, text=True, cwd=ROOT)
        if probe.stdout.strip() != "True":
            raise ConfigError("torch sees no CUDA device here: run the session on the GPU machine, or go through its "
                              "steps on this CPU with --dry-run")
        wheels = sorted((self.carry / "wheels").glob("*.whl"))
        if wheels:
            site = Path(f"/tmp/gpu_session_site_{os.getpid()}")  # two sessions may run side by side
            installed = subprocess.run([self.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                                        *map(str, wheels)], capture_output=True, text=True)
            if installed.returncode:
                print(f"installing the carried wheels failed; the steps run without them:\n{installed.stderr}")
            self.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [self.env.get("PYTHONPATH")])])
        self.record["wheels"] = [wheel.name for wheel in wheels]
        # What the steps import beyond the image's packages (data/ needs datasets; importing a GGUF file, gguf)
        check = "import datasets, gguf; print(datasets.__version__, gguf.__name__)"
        found = subprocess.run([self.python, "-c", check], capture_output=True, text=True, cwd=ROOT, env=self.env)
        self.record["imports"] = found.stdout.strip() if found.returncode == 0 else found.stderr.strip()[-300:]
        print(f"carried packages: {self.record['imports']}", flush=True)


# ---- the steps (each the same on the device and, at a micro scale, in a dry run) ----

def suite(s: Session) -> None:
    s.run("environment", ["nvidia-smi"] if not s.dry else [s.python, "-c", "print('dry run: no GPU')"], 30)
    s.module("environment_torch", "torch.utils.collect_env", limit_s=60)
    junit = str(s.folder() / "cuda.xml")
    # Without a GPU (the dry run) the module skips itself: pytest then exits 5, "no tests ran".
    s.module("cuda", "pytest", "tests/test_cuda.py", "-q", "-rfEs", "--timeout=180", f"--junitxml={junit}",
             "-p", "no:cacheprovider", limit_s=220, ok=(0, 5) if s.dry else (0,))
    # The fast tier; its commands' default device (auto) is CUDA there. The dry run takes one small module of it.
    tier = ["tests/test_layers.py"] if s.dry else ["--ignore=tests/test_cuda.py"]  # that file ran just above
    # pytest-xdist, one worker per test file (files share no run folders across workers then)
    # (verbose under xdist: each failure is named as it happens, so a run cut off at its limit still names them)
    workers = ["-n", str(s.suite_workers), "--dist", "loadfile", "-v"] if s.suite_workers > 1 else ["-q"]
    s.module("fast", "pytest", *tier, *workers, "-rfEs", "--timeout=180", f"--junitxml={s.folder() / 'fast.xml'}",
             "-p", "no:cacheprovider")


# (shape, seconds; 0: what is left). The tiny shape's compiled figures were measured on an H100 before
# (docs/performance.md): it runs eager only, with generation.
BENCH_SHAPES = [("research6", 130), ("research8", 130), ("tiny", 0)]


def bench(s: Session) -> None:
    for shape, limit in BENCH_SHAPES if not s.dry else [("micro", 0)]:
        args = (["--device", "cuda", "--repeats", "3", "--train-steps", "5", "--peak-size", "8192",
                 *(["--skip", "long_eval"] if shape == "tiny" else
                   ["--compile", "--profile", "--skip", "long_eval,generation"])]
                if not s.dry else
                ["--device", "cpu", "--repeats", "1", "--train-steps", "1", "--peak-size", "256", "--skip",
                 "generation,long_eval"])
        s.module(f"bench-{shape}", "scripts.bench", "--shape", shape, *args, "--out", str(s.folder()),
                 limit_s=limit or None)
    projection = preset_projection(s.folder())
    if projection:
        (s.folder() / "preset_projection.json").write_text(json.dumps(projection, indent=1) + "\n")
        print(f"[bench] {projection['note']}", flush=True)


def preset_projection(folder: Path) -> dict | None:
    """The gpu preset's training time at the measured speed of its model (research6, ours compiled, one process
    alone): an upper estimate, since several workers on one GPU overlap their kernel launches."""
    path = folder / "bench-research6.json"
    if not path.exists():
        return None
    modes = json.loads(path.read_text())["training"]["modes"]
    speed = modes.get("ours compiled", modes["ours (default)"])["tokens_per_s"]
    tokens = 5 * 5 * 1500 * 128 * 128  # encodings x seeds x steps x batch x L (configs/compare.toml [presets.gpu])
    return {"tokens_per_s_one_process": speed, "training_tokens": tokens, "training_s_one_process": tokens / speed,
            "note": f"gpu preset: {tokens / 1e6:.0f}M training tokens at {speed:,.0f} tokens/s (one process) = "
                    f"{tokens / speed / 60:.1f} min of training if the workers do not overlap"}


COST_VARIANTS = ('[{"position": "rope"}, {"position": "alibi"}, {"position": "t5"}, {"position": "kerple"}, '
                 '{"position": "fire"}]')


def costs(s: Session) -> None:
    device = "cpu" if s.dry else "cuda"
    s.module("attention_paths", "experiments.performance.attention_paths", "--device", device, "--flex-cuda",
             "--encodings", "alibi,t5,kerple,shaw,fox,fire" if not s.dry else "alibi",
             "--out", str(s.folder("paths_flex_cuda")), limit_s=40)
    variants, lengths = (COST_VARIANTS, "1,16") if not s.dry else ('[{"position": "alibi"}]', "1")
    # Without FlexAttention first (no compilation: about a quarter of the time); with it, what is left but a minute
    # for flex_costs (compiling FlexAttention on CUDA takes tens of seconds in each variant's process)
    for name, flex in (("encoding_costs", []), ("encoding_costs_flex", ["--flex-cuda"])):
        s.module(name, "scripts.encoding_costs", "--device", device, *flex, "--variants", variants, "--lengths",
                 lengths, "--batch", "16" if not s.dry else "1", "--train-steps", "4" if not s.dry else "0",
                 "--repeats", "2" if not s.dry else "1", "--rounds", "1", "--out", str(s.folder()),
                 limit_s=max(45.0, s.left() / 4) if not flex else max(45.0, s.left() - 60))
    s.module("flex_costs", "experiments.performance.flex_costs", "--device", device, "--cases",
             "alibi,shaw" if not s.dry else "alibi", "--multiples", "16" if not s.dry else "1",
             "--repeats", "5" if not s.dry else "1", "--rounds", "1", "--out", str(s.folder()))


# The learning-rate sweep of the quick and frontier presets (issue: verdicts in a fair fight): both presets' encodings
# (they share shape, budget and data), a log grid around the presets' 3e-3, 2 seeds; chosen on the 1x loss only.
SWEEP_ENCODINGS = ["none", "sinusoidal", "shaw", "t5", "alibi", "rope", "fire", "kerple", "ssmax", "fox",
                   "stickbreaking", "dape", "rope-randomized"]
SWEEP_VALUES = ["1.5e-3", "3e-3", "6e-3", "1.2e-2"]
SWEEP_WORKERS = 13  # comparison workers on the one GPU (16 CPU cores there)


def carried_data(s: Session, name: str, where: str, folder: str) -> tuple[Path, dict]:
    """The preparation carried as CARRY/NAME copied into the step's FOLDER/data (once), where a comparison takes it as
    its own (same source and split); returns FOLDER and the preparation's meta."""
    data = s.carry / name
    if not (data / "meta.json").exists():
        raise StepSkipped(f"no prepared data in {data}: run `make gpu-carry` {where}, and carry {data} in this call")
    out = s.folder(folder)
    if not (out / "data" / "meta.json").exists():
        shutil.copytree(data, out / "data", dirs_exist_ok=True)
    return out, json.loads((data / "meta.json").read_text())


def sweep(s: Session) -> None:
    out, meta = carried_data(s, "quick_data", "(it prepares the quick preset's stdlib)", "sweep_lr")
    values = SWEEP_VALUES if not s.dry else SWEEP_VALUES[:2]
    encodings = SWEEP_ENCODINGS if not s.dry else ["alibi", "rope"]
    s.module("sweep", "experiments.sweep", "--config", "configs/compare.toml", "--preset", "quick", "--values",
             ",".join(values), "--out", str(out), f"--compare.encodings={','.join(encodings)}",
             f"--compare.seeds={'1,2' if not s.dry else '1'}", f"--compare.source={meta['source']}",
             f"--compare.val_fraction={meta['val_fraction']}",
             f"--compare.workers={SWEEP_WORKERS if not s.dry else 1}",
             *([arg for arg in DRY_PRESET if not arg.startswith(("--compare.encodings", "--compare.lengths",
                                                                 "--compare.workers"))] if s.dry else []))


# The dry run's gpu preset: the preset's own settings, then a micro model and budget (two encodings, 2 seeds)
DRY_PRESET = ["--compare.encodings=alibi,rope", "--compare.eval_tokens=512", "--compare.workers=1",
              "--compare.lengths=1x,2x", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
              "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.batch_size=2", "--train.max_steps=4",
              "--train.warmup_steps=1", "--train.eval_interval=2", "--train.eval_batches=1", "--train.compile=false"]


def preset(s: Session) -> None:
    out, meta = carried_data(s, "data", "where the books are", "compare_gpu")
    args = ["--config", "configs/compare.toml", "--preset", "gpu", f"--compare.source={meta['source']}",
            f"--compare.val_fraction={meta['val_fraction']}", f"--compare.out={out}", *(DRY_PRESET if s.dry else [])]
    for stage, seeds in enumerate(("1", "1,2") if s.dry else ("1,2,3", "1,2,3,4,5")):
        if stage and s.left() < 60:
            print(f"[preset] seeds {seeds} left for a later call ({s.left():.0f} s left)", flush=True)
            break
        s.module(f"compare-seeds-{seeds.replace(',', '')}", "experiments.compare", *args, f"--compare.seeds={seeds}")


REAL_MODEL_SIZE = "the imported checkpoint is 517 MiB in float32 and its GGUF file 93.8 MiB"


def smollm2(s: Session) -> Path:
    """The SmolLM2 checkpoint on this machine: carried as CARRY/smollm2, imported in an earlier call, or imported
    now from the GGUF parts carried in earlier calls (experiments.gpu_lease.carry) after checking their digest."""
    for folder in (s.carry / "smollm2", ROOT / "runs" / "smollm2"):
        if (folder / "config.json").exists():
            return folder
    parts = sorted(s.carry.glob("gguf-*/manifest.json"))
    if not parts:
        raise StepSkipped(f"no SmolLM2 here ({REAL_MODEL_SIZE}, over the 64 MiB a call carries): carry the GGUF "
                          "parts that `make gpu-carry` writes, one per call on the same warm machine")
    manifest = json.loads(parts[0].read_text())
    pieces = [s.carry / f"gguf-{index}" / f"part-{index}" for index in range(1, manifest["parts"] + 1)]
    missing = [str(piece.parent.name) for piece in pieces if not piece.exists()]
    if missing:
        raise StepSkipped(f"GGUF parts {missing} are not on this machine (it was given back between calls, or "
                          "they were not carried): carry them, then run this step again")
    gguf = s.folder() / manifest["name"]
    digest = hashlib.sha256()
    with open(gguf, "wb") as whole:
        for piece in pieces:
            data = piece.read_bytes()
            digest.update(data)
            whole.write(data)
    if digest.hexdigest() != manifest["sha256"]:
        raise ConfigError(f"the reassembled {manifest['name']} differs from the original (sha256); carry its "
                          "parts again")
    result = s.module("import", "scripts.import_hf", "--checkpoint", str(gguf), "--out", str(ROOT / "runs" /
                      "smollm2"), "--overwrite", limit_s=120)
    gguf.unlink()
    if result["rc"] != 0:
        raise ConfigError("importing the GGUF file failed (see import.log): it needs the gguf wheel, which "
                          "`make gpu-carry` puts among the carried wheels")
    return ROOT / "runs" / "smollm2"


def real_model(s: Session) -> None:
    checkpoint = smollm2(s)
    books = sorted((s.carry / "book").glob("*.txt"))
    if not books:
        raise StepSkipped(f"no book in {s.carry / 'book'}: carry it (make gpu-carry puts War and Peace there)")
    settings = (["--lengths", "1x,2x,4x,8x", "--methods", "none,linear,ntk,yarn,logn,dynamic", "--passkey-methods",
                 "none,yarn", "--passkey-lengths", "1x,2x,4x,8x", "--device", "cuda",
                 "--minutes", f"{max(0.5, (s.left() - 60) / 60):.1f}"] if not s.dry else
                ["--lengths", "1x,2x", "--methods", "none,yarn", "--dynamic-tail", "4", "--passkey-methods", "none",
                 "--passkey-lengths", "160", "--device", "cpu", "--minutes", "1"])
    s.module("real_model", "experiments.real_model", "--checkpoint", str(checkpoint), "--book", str(books[0]), "--texts",
             "book", "--windows", "1", "--depths", "0.5", *settings, "--out", str(s.folder("real_model")))


BODIES: dict[str, Callable[[Session], None]] = {"suite": suite, "sweep": sweep, "bench": bench, "costs": costs,
                                                "preset": preset, "real_model": real_model}


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.gpu_lease.session", __doc__)
    parser.add_argument("steps", nargs="*", help=f"steps to run, in the order given (default: all: {','.join(STEPS)})")
    parser.add_argument("--dry-run", action="store_true", help="the same steps on this CPU at a micro scale")
    add_out(parser, "where each step's archive and session.json go (experiments/gpu_lease/session.sh passes the device "
                    "tool's $OUT)", type=Path, default=ROOT / "runs" / "gpu_session" / "out")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu_session",
                        help="each step's own files, WORK/STEP (default: runs/gpu_session)")
    parser.add_argument("--limits", default="",
                        help="seconds per step for this call, STEP=SECONDS,... (default: " +
                             ",".join(f"{k}={v}" for k, v in LIMITS.items()) + ")")
    parser.add_argument("--suite-workers", type=int, default=1,
                        help="pytest-xdist workers for the suite's fast tier (default 1: no xdist; the GPU "
                             "machine's image has pytest-xdist)")
    parser.add_argument("--carry", type=Path, default=ROOT / "runs" / "gpu_carry",
                        help="what the calls carry (python -m experiments.gpu_lease.carry writes it; default: "
                             "runs/gpu_carry)")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    steps = comma_list(args.steps) or STEPS
    steps = STEPS if steps == ["all"] else steps
    unknown = [step for step in steps if step not in STEPS]
    if unknown:
        raise ConfigError(f"unknown steps {unknown}; the steps are {', '.join(STEPS)} (or all)")
    limits = {}
    for item in comma_list(args.limits):
        step, _, seconds = item.partition("=")
        if step not in STEPS or not seconds.replace(".", "", 1).isdigit():
            raise ConfigError(f"--limits item {item!r} must look like STEP=SECONDS with STEP one of "
                              f"{', '.join(STEPS)} (for example --limits suite=300,preset=480)")
        limits[step] = float(seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args.out.resolve(), args.work.resolve(), args.carry.resolve(), args.dry_run, limits,
                      args.suite_workers)
    session.setup()
    for step in steps:
        session.run_step(step, BODIES[step])
    done = session.record["steps"]
    print("\n" + "\n".join(f"{name:<11} {entry['status']:<9} {entry['seconds']:>6.0f} s  {entry['reason']}"
                           for name, entry in done.items()), flush=True)
    return 0 if all(entry["status"] == "ok" for entry in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
