"""What every worker job of eval.compare and eval.tasks does around its work: its output to its own log file
(when it runs in a worker process) and its torch thread count."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch


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
