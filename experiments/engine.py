"""The study engine: every study of experiments/ is a spec run by this one engine.

A spec (`Study`) is a settings dataclass, the cells those settings declare, one measure function that turns a cell
into a record, and a report function that renders the records (experiments/render.py). The engine owns the rest:

    records   OUT/records/KEY.json, one per cell: KEY is the first 16 hex digits of the SHA-256 of the cell (its JSON
              with sorted keys, without its "local" part: where its inputs lie, how it runs), so a record is found
              again wherever and whenever the same cell is asked for, and a changed setting makes a new record
    lock      a cell is measured under OUT/records/KEY.lock (the kernel's flock, held by the process that runs the
              study, released when it ends, even killed): two processes on one study share its cells
    resume    a cell whose record exists is not measured again; a rerun measures what is missing
    deadline  --minutes: no cell starts after that many minutes (those running finish)
    progress  a line per cell started and finished, with the count done and an estimate of the time left
    log       OUT/invocations.jsonl: each invocation's command, machine, where its cells ran, wall time and counts
    report    after every invocation, and alone with --report-only (from OUT/study.json and the records)

Where cells run: --workers local processes (default: one per usable CPU core, or one per GPU; 1: in this process),
or with --cluster ADDRESS the tasks of a Ray cluster (`make cluster-deps`; docs/guide/studies.md). The spec, the
records and the report are the same wherever cells ran: a cell carries everything its measurement depends on, and
the driver writes every record as its result arrives.

Settings: the dataclass's defaults, then the [SECTION] table of --config FILE (and its tables named after the
settings' dict fields, e.g. [model], [train]), then its [presets.NAME] for --preset NAME, then --section.key=value
overrides and the flags (one per setting, e.g. --seeds 1,2 or --compare.seeds=1,2).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import fcntl
import hashlib
import importlib
import json
import multiprocessing
import os
import platform
import shlex
import signal
import socket
import statistics
import sys
import time
import tomllib
import traceback
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from commands import comma_list, command_parser, did_you_mean, portable_command, results_json, suggest_options
from errors import ConfigError, cli_command
from model.fields import check_keys, parse_override_value, set_dotted

STUDY_FILE = "study.json"  # OUT/study.json: the study, its settings and its cells' keys, as the last invocation left them
LOG_FILE = "invocations.jsonl"
# Settings a study may hold that the engine's flags override (a preset may set them: the gpu preset's workers)
ENGINE_SETTINGS = ("workers", "threads")


def option(default: Any, help: str = "") -> Any:
    """A setting of a study: its default and its --help line (a list or dict default is copied for each instance)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Context:
    """Where a cell runs: its study's folder (the same path on every machine of a cluster) and its thread count."""

    out: Path
    threads: int = 1
    device: str = "auto"

    @property
    def work(self) -> Path:
        """OUT/work: what a study keeps besides its records (trained runs, prepared data, logs), never committed."""
        return self.out / "work"


@dataclass
class Records:
    """What a report reads: the settings, the cells in order, their records (key -> stored record: "record",
    "seconds", "machine") and the invocations on record."""

    settings: Any
    out: Path
    cells: list[dict]
    stored: dict[str, dict]
    invocations: list[dict]
    preset: str | None = None  # the --preset the settings came from

    def done(self) -> list[tuple[dict, dict]]:
        """(cell, record) for every cell measured, in the cells' order."""
        return [(cell, self.stored[key(cell)]["record"]) for cell in self.cells if key(cell) in self.stored]

    def missing(self) -> list[dict]:
        return [cell for cell in self.cells if key(cell) not in self.stored]

    def seconds(self, cell: dict) -> float | None:
        found = self.stored.get(key(cell))
        return None if found is None else found["seconds"]


@dataclass(frozen=True)
class Study:
    """A study: what the engine needs of it. `module` names the module that defines it as STUDY, from which every
    worker, local or remote, imports it."""

    module: str
    settings: type  # a dataclass whose fields are the study's settings; it has an `out` field
    cells: Callable[[Any, Context], list[dict]]  # settings -> the cells, in the order to run them; each has a "name"
    measure: Callable[[dict, Context], dict]  # one cell -> its record (JSON: numbers, strings, lists, dicts)
    report: Callable[[Records], None]  # the records -> OUT/report.md, tables and figures (experiments/render.py)
    prepare: Callable[[Any, Context], None] | None = None  # once per invocation, before the cells (data, checks)
    doc: str = ""
    section: str = ""  # the settings' TOML table and override prefix (default: the module's last name)

    @property
    def name(self) -> str:
        return self.section or self.module.rsplit(".", 1)[-1]


def key(cell: dict) -> str:
    """A cell's address: what it is, not where its inputs lie or how it runs ("local" is left out)."""
    what = {name: value for name, value in cell.items() if name != "local"}
    return hashlib.sha256(json.dumps(what, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ the machine

def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    return max(1, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine() -> str:
    """What a cell or an invocation ran on: the GPUs where CUDA is used, else the CPU's model (with avx512_bf16 where
    it computes bfloat16 natively), its family and model (AMD's 25/1: Zen 3), the usable cores and the RAM."""
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        return ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names))
    cpu, memory = platform.processor() or platform.machine(), ""
    with contextlib.suppress(OSError, StopIteration):
        info = Path("/proc/cpuinfo").read_text()
        field = dict(reversed([tuple(p.strip() for p in line.split(":", 1)) for line in info.splitlines() if ":" in line]))
        cpu = f"{field['model name']} (family {field['cpu family']}, model {field['model']})"
        cpu += " (avx512_bf16)" if " avx512_bf16" in info else ""
    with contextlib.suppress(OSError, StopIteration):
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        memory = f", {kib / 2**20:.0f} GiB RAM"
    return f"{cpu}, {usable_cores()} usable core(s){memory}"


def die_with_parent(parent: int) -> None:
    """A local worker's first act (Linux): SIGTERM when the process that started it dies, even killed, so that no
    orphan goes on measuring; an orphan already (its parent died first) exits at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)


# ------------------------------------------------------------------------------------------ measuring one cell

def run_cell(module: str, cell: dict, out: str, threads: int, device: str, log: str | None) -> dict:
    """Measure one cell (in any process: this one, a local worker, a Ray task): {"record", "seconds", "machine"} or
    {"error", "seconds", "machine"}; never raises for the measure's own errors. `log`: a file that takes its output."""
    import torch

    started = time.perf_counter()
    outcome: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        if log is not None:
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(open(log, "a", buffering=1))
            stack.enter_context(contextlib.redirect_stdout(handle))
            stack.enter_context(contextlib.redirect_stderr(handle))
        torch.set_num_threads(threads)
        try:
            study = importlib.import_module(module).STUDY
            print(f"=== {cell['name']} ===", flush=True)
            outcome["record"] = study.measure(cell, Context(Path(out), threads, device))
        except Exception as error:  # a failed cell is reported; the study goes on
            traceback.print_exc()
            outcome["error"] = f"{type(error).__name__}: {error}"[:500]
    return {**outcome, "seconds": time.perf_counter() - started, "machine": machine()}


class Serial:
    """Cells in this process, one at a time."""

    def __init__(self, study: Study, context: Context) -> None:
        self.study, self.context, self.capacity = study, context, 1
        self.where = f"this process, {context.threads} thread(s)"

    def submit(self, cell: dict) -> Any:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(run_cell(self.study.module, cell, str(self.context.out), self.context.threads,
                                   self.context.device, None))
        return future

    def wait(self, handles: list[Any]) -> list[tuple[Any, dict]]:
        return [(handle, handle.result()) for handle in handles if handle.done()]

    def close(self) -> None:
        pass


def _start_worker(slots: Any, parent: int) -> None:
    die_with_parent(parent)
    import torch

    index = slots.get()
    if torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())


class Processes(Serial):
    """Cells in `workers` local processes (spawned: a clean interpreter each), each cell's output in
    OUT/work/logs/NAME.log."""

    def __init__(self, study: Study, context: Context, workers: int) -> None:
        super().__init__(study, context)
        spawn = multiprocessing.get_context("spawn")
        slots = spawn.Queue()
        for index in range(workers):
            slots.put(index)
        self.pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn, initializer=_start_worker,
                                                           initargs=(slots, os.getpid()))
        self.capacity = workers
        self.where = f"{workers} local processes x {context.threads} thread(s); logs in {context.work / 'logs'}"

    def submit(self, cell: dict) -> Any:
        log = self.context.work / "logs" / f"{cell['name'].replace('/', '_').replace(' ', '_')}.log"
        return self.pool.submit(run_cell, self.study.module, cell, str(self.context.out), self.context.threads,
                                self.context.device, str(log))

    def wait(self, handles: list[Any]) -> list[tuple[Any, dict]]:
        done, _ = concurrent.futures.wait(handles, timeout=2, return_when=concurrent.futures.FIRST_COMPLETED)
        found = []
        for handle in done:
            try:
                found.append((handle, handle.result()))
            except Exception as error:  # the worker process itself died
                found.append((handle, {"error": f"worker died ({type(error).__name__}: {error})", "seconds": 0.0}))
        return found

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


class Cluster(Serial):
    """Cells as tasks of a running Ray cluster (`ray start` on each machine; docs/guide/studies.md). Every node
    reads the study's inputs and OUT/work at the same path (a shared filesystem); the records come back to this
    process, which writes them. A task lost with its node, or left waiting GRACE seconds with no live node to run
    it, is reported failed; a rerun measures it again."""

    GRACE = 30.0

    def __init__(self, study: Study, context: Context, address: str, workers: int) -> None:
        super().__init__(study, context)
        try:
            import ray
        except ImportError as error:
            raise ConfigError("--cluster needs Ray, an optional extra: run `make cluster-deps`") from error
        host, _, port = address.rpartition(":")
        try:  # ray.init retries a wrong address for minutes
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as error:
            raise ConfigError(f"--cluster {address}: no Ray head answers there ({error}); start one with "
                              "`ray start --head --port=PORT` and give HOST:PORT") from error
        self.ray, self.waiting_since = ray, None
        root = Path(__file__).resolve().parent.parent  # the repository root: how a worker imports the study
        ray.init(address=address, logging_level="WARNING", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(root)}})
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < context.threads:
            raise ConfigError(f"the Ray cluster at {address} offers {cpus} CPUs, fewer than --threads "
                              f"{context.threads}: start a worker node (`ray start --address={address}`)")
        gpus = 1 if ray.cluster_resources().get("GPU", 0) else 0
        self.task = ray.remote(num_cpus=context.threads, num_gpus=gpus, max_retries=0)(run_cell)
        self.capacity = workers or max(1, cpus // context.threads)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        self.where = f"Ray cluster at {address} ({len(nodes)} nodes, {cpus} CPUs), tasks of {context.threads} thread(s)"

    def submit(self, cell: dict) -> Any:
        return self.task.remote(self.study.module, cell, str(self.context.out), self.context.threads,
                                self.context.device, None)

    def wait(self, handles: list[Any]) -> list[tuple[Any, dict]]:
        done, _ = self.ray.wait(handles, num_returns=1, timeout=2)
        found = []
        for handle in done:
            try:
                found.append((handle, self.ray.get(handle)))
            except Exception as error:  # the task's worker or node died
                found.append((handle, {"error": f"task lost ({type(error).__name__}: {error})"[:500],
                                       "seconds": 0.0}))
        alive = sum(node["Resources"].get("CPU", 0) for node in self.ray.nodes() if node["Alive"]) if not done else 1
        self.waiting_since = None if alive else self.waiting_since or time.monotonic()
        if self.waiting_since is not None and time.monotonic() - self.waiting_since > self.GRACE:
            for handle in handles:  # Ray never fails a task that waits for a node: the study gives it up
                self.ray.cancel(handle, force=True)
            found = [(handle, {"error": "no live node of the cluster offers CPUs", "seconds": 0.0})
                     for handle in handles]
            self.capacity = 0  # and starts no other cell: a rerun continues once a node is back
        return found

    def close(self) -> None:
        self.ray.shutdown()


# --------------------------------------------------------------------------------------------- the study folder

def read_stored(out: Path, keys: list[str]) -> dict[str, dict]:
    """key -> stored record, for the keys whose record exists in OUT/records."""
    found = {}
    for name in keys:
        path = out / "records" / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    staging.replace(path)


@contextlib.contextmanager
def claim(out: Path, name: str) -> Iterator[bool]:
    """True while this process holds cell `name`'s lock and its record is still to make; False when another live
    process holds it or its record exists."""
    path = out / "records" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield not (out / "records" / f"{name}.json").exists()  # under the lock: another may just have written it
        finally:
            path.unlink(missing_ok=True)


def load_records(study: Study, out: Path) -> Records:
    """The records of the study in `out` as its last invocation declared them (OUT/study.json)."""
    path = out / STUDY_FILE
    if not path.exists():
        raise ConfigError(f"{out} holds no study ({STUDY_FILE} is missing): run python -m {study.module} with "
                          f"--out {out} first")
    saved = json.loads(path.read_text())
    if saved["study"] != study.module:
        raise ConfigError(f"{out} holds a study of {saved['study']}, not of {study.module}")
    settings = study.settings(**saved["settings"])
    stored = read_stored(out, [c.get("key") or key(c) for c in saved["cells"]])
    cells = [stored[c["key"]]["cell"] if c.get("key") in stored else c for c in saved["cells"]]
    log = out / LOG_FILE
    invocations = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    return Records(settings, out, cells, stored, invocations, saved.get("preset"))


def declare(study: Study, out: Path, settings: Any, cells: list[dict], preset: str | None) -> None:
    """OUT/study.json: the study, its settings and its cells in order; a cell with a record is named there by its
    key (the record holds the cell), one without by what it is."""
    stored = {name for name in (key(cell) for cell in cells) if (out / "records" / f"{name}.json").exists()}
    listed = [{"name": c["name"], "key": key(c)} if key(c) in stored else c for c in cells]
    write_atomic(out / STUDY_FILE, results_json({"study": study.module, "preset": preset, "cells": listed,
                                                 "settings": dataclasses.asdict(settings)}, exact=True))


# -------------------------------------------------------------------------------------------------- running

def progress(done: int, total: int, started: float, worked: list[float], capacity: int) -> str:
    elapsed = time.perf_counter() - started
    left = (f"about {statistics.fmean(worked) * (total - done) / capacity / 60:.0f} min left" if worked
            else "no estimate yet")
    return f"[{done}/{total} done, elapsed {elapsed / 60:.1f} min, {left}]"


def run(study: Study, settings: Any, command: str, minutes: float, workers: int, threads: int, cluster: str | None,
        preset: str | None = None, device: str = "auto") -> int:
    """Measure the study's missing cells, write their records, log the invocation and render the report. 0 when no
    cell failed (cells left by the deadline are not failures: a rerun continues), 1 otherwise."""
    started = time.perf_counter()
    out = Path(settings.out)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = usable_cores()
    context = Context(out, threads or max(1, cores // max(1, workers or gpus or cores)), device)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "study.lock", "w") as lock:  # one invocation at a time prepares and declares the cells
        fcntl.flock(lock, fcntl.LOCK_EX)
        if study.prepare is not None:
            study.prepare(settings, context)
        cells = json.loads(json.dumps(study.cells(settings, context)))  # as a record keeps them: keys are strings
        names = [cell["name"] for cell in cells]
        if len(set(names)) != len(names):
            raise ConfigError(f"the study declares two cells of one name: {sorted(n for n in names if names.count(n) > 1)}")
        declare(study, out, settings, cells, preset)
    stored = read_stored(out, [key(cell) for cell in cells])
    todo = [cell for cell in cells if key(cell) not in stored]
    if cluster:
        backend: Serial = Cluster(study, context, cluster, workers)
    elif min(workers or gpus or cores, len(todo)) > 1:
        backend = Processes(study, context, min(workers or gpus or cores, len(todo)))
    else:
        backend = Serial(study, context)
    print(f"{study.name}: {len(cells)} cells, {len(cells) - len(todo)} with a record; {len(todo)} to measure on "
          f"{backend.where}", flush=True)
    deadline = started + 60 * minutes
    counts = {"measured": 0, "failed": 0, "held elsewhere": 0}
    worked: list[float] = []
    flying: dict[Any, tuple[dict, contextlib.ExitStack]] = {}
    try:
        while todo or flying:
            while todo and len(flying) < backend.capacity and time.perf_counter() < deadline:
                cell = todo.pop(0)
                stack = contextlib.ExitStack()
                if not stack.enter_context(claim(out, key(cell))):
                    stack.close()
                    counts["held elsewhere"] += 1
                    continue
                print(f"{progress(len(cells) - len(todo) - len(flying) - 1, len(cells), started, worked, backend.capacity)}"
                      f" {cell['name']}: started", flush=True)
                flying[backend.submit(cell)] = (cell, stack)
            if not flying:
                break
            for handle, outcome in backend.wait(list(flying)):
                cell, stack = flying.pop(handle)
                if "record" in outcome:
                    write_atomic(out / "records" / f"{key(cell)}.json", results_json(  # every float as measured
                        {"key": key(cell), "cell": cell, "record": outcome["record"], "seconds": outcome["seconds"],
                         "machine": outcome["machine"], "finished": time.strftime("%Y-%m-%d %H:%M:%S")}, exact=True))
                    counts["measured"] += 1
                    worked.append(outcome["seconds"])
                    said = f"done ({outcome['seconds'] / 60:.1f} min)"
                else:
                    counts["failed"] += 1
                    said = f"FAILED: {outcome['error']}"
                stack.close()
                done = len(cells) - len(todo) - len(flying)
                print(f"{progress(done, len(cells), started, worked, backend.capacity)} {cell['name']}: {said}",
                      flush=True)
    finally:
        for _, stack in flying.values():
            stack.close()
        backend.close()
        wall = time.perf_counter() - started
        left = len(todo) + counts["held elsewhere"]
        with open(out / LOG_FILE, "a") as log:
            log.write(json.dumps({"command": command, "machine": machine(), "where": backend.where,
                                  "wall_s": round(wall, 1), "cells": len(cells), **counts, "left": left,
                                  "finished": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        declare(study, out, settings, cells, preset)
    if left:
        print(f"{left} cell(s) not measured (the deadline, or another process has them): run again to continue")
    records = load_records(study, out)
    if records.done():
        study.report(records)
        print(f"{len(records.done())} of {len(cells)} cells have a record; rendered in {out} ({wall / 60:.1f} min)")
    else:
        print(f"no cell has a record yet: no report ({wall / 60:.1f} min)")
    return 1 if counts["failed"] else 0


# ------------------------------------------------------------------------------------------- the command line

def _value(text: str, default: Any) -> Any:
    """A flag's text as the type of the setting's default (a list: comma-separated items)."""
    if isinstance(default, list):  # a TOML list, or items separated by commas
        value = parse_override_value(text) if text.strip().startswith("[") else None
        return value if isinstance(value, list) else [parse_override_value(item) for item in comma_list(text)]
    value = parse_override_value(text)
    if isinstance(default, str) or (isinstance(default, bool) != isinstance(value, bool)):
        return text if not isinstance(default, bool) else value
    return value


def build_parser(study: Study) -> argparse.ArgumentParser:
    parser = command_parser(study.module, study.doc, epilog=f"Overrides: --{study.name}.key=value for any setting, "
                            "and --TABLE.key=value for a key of a table setting (e.g. --model.dim=64).")
    engine = parser.add_argument_group("the study engine (experiments/engine.py)")
    engine.add_argument("--config", type=Path, metavar="FILE", help=f"a TOML file: its [{study.name}] table and "
                        "tables named after table settings; its [presets.NAME] tables for --preset")
    engine.add_argument("--preset", help="a [presets.NAME] table of --config")
    engine.add_argument("--report-only", action="store_true", help="measure nothing: render the report of --out "
                        "from its records and stored settings (a setting given here replaces the stored one)")
    engine.add_argument("--minutes", type=float, default=100_000.0, help="start no cell after this many minutes")
    engine.add_argument("--workers", type=int, default=0, help="cells at a time (0: one per usable CPU core, or per "
                        "GPU; 1: in this process)")
    engine.add_argument("--threads", type=int, default=0, help="torch threads per cell (0: cores / workers)")
    engine.add_argument("--cluster", metavar="ADDRESS", help="run the cells on the Ray cluster at ADDRESS "
                        "(HOST:PORT of its head; `make cluster-deps`)")
    engine.add_argument("--device", default="auto", help="auto | cpu | cuda | mps: where the cells compute")
    own = parser.add_argument_group(f"the settings of {study.name} (also --{study.name}.key=value, or [{study.name}] "
                                    "of --config)")
    hints = typing.get_type_hints(study.settings)
    for item in dataclasses.fields(study.settings):
        if typing.get_origin(hints[item.name]) is dict or hints[item.name] is dict or item.name in ENGINE_SETTINGS:
            continue  # a table (--NAME.key=value or the config's [NAME]), or one of the engine's flags
        shown = ",".join(map(str, _default(item))) if isinstance(_default(item), list) else _default(item)
        own.add_argument("--" + item.name.replace("_", "-"), dest=f"setting_{item.name}", metavar="VALUE", default=None,
                         help=f"{item.metadata.get('help', '')} (default: {shown})".replace("%", "%%"))
    return parser


def resolve_settings(study: Study, args: argparse.Namespace, overrides: list[str]) -> Any:
    """The study's settings from its defaults, --config, --preset, overrides and flags (in that order)."""
    fields = {item.name: item for item in dataclasses.fields(study.settings)}
    tables = [name for name, item in fields.items() if isinstance(_default(item), dict)]
    values: dict[str, Any] = {}
    if args.config is not None:
        if not args.config.exists():
            raise ConfigError(f"--config {args.config}: no such file")
        try:
            loaded = tomllib.loads(args.config.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{args.config}: invalid TOML ({error})") from error
        presets = loaded.pop("presets", {})
        values.update(loaded.pop(study.name, {}))
        for name in list(loaded):
            if name not in tables:
                raise ConfigError(f"{args.config}: [{name}] is not a table of {study.name}'s settings; its tables are "
                                  f"[{study.name}] and {['[' + t + ']' for t in tables]}")
            values[name] = loaded.pop(name)
        if args.preset is not None:
            if args.preset not in presets:
                raise ConfigError(f"--preset {args.preset!r} is not in {args.config}; available: {sorted(presets)}"
                                  f"{did_you_mean(args.preset, presets)}")
            for dotted, value in presets[args.preset].items():
                _set(values, dotted, value, study, tables, f"{args.config} [presets.{args.preset}]")
    elif args.preset is not None:
        raise ConfigError("--preset names a [presets.NAME] table of --config: give --config too")
    for override in overrides:
        dotted, text = override[2:].split("=", 1)
        name = dotted.split(".", 1)[1] if dotted.startswith(study.name + ".") else None
        default = _default(fields[name]) if name in fields else None
        _set(values, dotted, _value(text, default) if name in fields else parse_override_value(text), study, tables,
             "override")
    for name, item in fields.items():
        given = getattr(args, f"setting_{name}", None)
        if given is not None:
            values[name] = _value(given, _default(item))
    return study.settings(**check_keys(study.settings, values, study.name))


def _default(item: dataclasses.Field) -> Any:
    return item.default if item.default is not dataclasses.MISSING else item.default_factory()


def _set(values: dict, dotted: str, value: Any, study: Study, tables: list[str], where: str) -> None:
    section, _, rest = dotted.partition(".")
    if section == study.name and rest and "." not in rest:
        values[rest] = value
    elif section in tables and rest:
        set_dotted(values, dotted, value, where)
    else:
        raise ConfigError(f"{where}: {dotted!r} sets no setting of {study.name}: give {study.name}.KEY or one of "
                          f"{[t + '.KEY' for t in tables]}")


def main(module: str, argv: list[str] | None = None) -> int:
    """`python -m MODULE`: the study MODULE.STUDY run by the engine."""
    study = importlib.import_module(module).STUDY
    return cli_command(lambda args: _main(study, args))(argv)


def _main(study: Study, argv: list[str] | None) -> int:
    parser = build_parser(study)
    args, overrides = parser.parse_known_args(argv)
    bad = [item for item in overrides if not item.startswith("--") or "=" not in item or "." not in item.split("=")[0]]
    if bad:
        raise ConfigError(f"unknown arguments {bad}: {parser.prog} takes the flags of its --help and "
                          f"--section.key=value overrides{suggest_options(bad, parser)}")
    typed = sys.argv[1:] if argv is None else argv
    command = portable_command(" ".join([parser.prog, *map(shlex.quote, typed)]))
    if args.report_only:
        out = Path(getattr(args, "setting_out", None) or resolve_settings(study, args, overrides).out)
        records = load_records(study, out)
        given = {f.name: _value(v, _default(f)) for f in dataclasses.fields(study.settings)  # a reading of the records
                 if (v := getattr(args, f"setting_{f.name}", None)) is not None}  # (e.g. --beside) given here
        study.report(dataclasses.replace(records, settings=dataclasses.replace(records.settings, **given)))
        print(f"rendered {out} from {len(records.done())} of {len(records.cells)} records")
        return 0
    settings = resolve_settings(study, args, overrides)
    return run(study, settings, command, args.minutes, args.workers or getattr(settings, "workers", 0),
               args.threads or getattr(settings, "threads", 0), args.cluster, args.preset, args.device)
