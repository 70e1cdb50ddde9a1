"""What every worker job of experiments.compare and experiments.tasks does around its work: its output to its own
log file (when it runs in a worker process) and its torch thread count; what every worker process does first; how
a job takes the cores of workers that have gone idle (FreeCores: experiments.compare's last jobs); and the settings
a run folder was trained with, to reuse it on a re-run only when they are this run's."""
from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import platform
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from errors import ConfigError
from model.checkpoint import has_checkpoint, load_trainer_state
from train.config import build_run_config


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one, e.g. under taskset or a
    container's cpuset; else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def machine_description() -> str:
    """The machine a comparison ran on, for its report: the GPU(s) where CUDA is used, else the CPU model (from
    /proc/cpuinfo where there is one) and the cores this process may use."""
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        return ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names))
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {usable_cores()} usable core(s)"


def worker_layout(workers: int, jobs: int, gpus: int = 0, threads: int = 0) -> tuple[int, int]:
    """(worker processes, torch threads each) for `jobs` independent jobs: `workers` if given, else one per GPU
    where there are `gpus`, else one per usable core (on this project's 2-core CPU two single-thread processes
    train faster than one two-thread process); never more than the jobs. `threads` if given, else the cores split
    evenly between the workers."""
    cores = usable_cores()
    workers = max(1, min(workers or gpus or cores, jobs))
    return workers, threads or max(1, cores // workers)


@contextlib.contextmanager
def job_output(log_path: Path | None, threads: int) -> Iterator[None]:
    """Inside: stdout and stderr appended, line by line, to log_path (if given), and `threads` torch threads (if
    not 0)."""
    with contextlib.ExitStack() as stack:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(log_path, "a", buffering=1))
            stack.enter_context(contextlib.redirect_stdout(log))
            stack.enter_context(contextlib.redirect_stderr(log))
        if threads:
            torch.set_num_threads(threads)
        yield


def die_with_parent(parent: int | None = None) -> None:
    """A worker process's first act: on Linux, ask to be sent SIGTERM when the process that started it dies, even
    killed (SIGTERM, SIGKILL), so that no orphan worker goes on training and writing into the output folder
    (prctl PR_SET_PDEATHSIG; elsewhere nothing is done). `parent`: the starting process's pid; if it died before
    the request took effect (the worker is already an orphan), the worker exits at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if parent is not None and os.getppid() != parent:
            os._exit(1)


@dataclass(frozen=True)
class FreeCores:
    """The thread count a pool's main process raises when workers go idle (a multiprocessing.Value, 0 until then),
    as the callback scoring calls before each batch (eval/scoring.py's on_batch): a running job then takes the
    threads it may use now (torch.set_num_threads), so the last jobs of a comparison finish on every core instead
    of one each. The thread count changes how fast, not what, a forward computes (float rounding aside:
    tests/test_jobs.py)."""

    shared: Any

    def __call__(self) -> None:
        wanted = self.shared.value
        if wanted and wanted != torch.get_num_threads():
            torch.set_num_threads(wanted)


def saved_run_config(out: Path) -> dict | None:
    """The settings a run folder was trained with, through today's dataclasses (new keys take their defaults);
    None when it holds no checkpoint or unreadable settings."""
    if not has_checkpoint(out):
        return None
    try:
        return build_run_config(copy.deepcopy(load_trainer_state(out).get("run_config")), str(out),
                                saved=True).to_dict()
    except (ConfigError, TypeError, AttributeError):
        return None


# Where metrics go, whether the step is compiled, and whether the head and loss run in chunks (the same loss, summed in
# another order; unset, it follows the device): how a run executes, not what it trains (a resumed run may change any
# of them), so not settings that make runs differ.
EXECUTION = ("report_to", "tracker_group", "compile", "fused_loss")


def comparable(settings: dict | None) -> dict | None:
    """A run's settings without those a comparison may add or change on a re-run (EXECUTION)."""
    if settings is None:
        return None
    return {**settings, "train": {k: v for k, v in settings.get("train", {}).items() if k not in EXECUTION}}
