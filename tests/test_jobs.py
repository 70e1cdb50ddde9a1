"""experiments/jobs.py: what every worker process of experiments.compare and experiments.tasks does."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PARENT = '''
import concurrent.futures, multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])
from experiments.jobs import die_with_parent

def report_and_wait():
    print(os.getpid(), flush=True)
    time.sleep(120)

if __name__ == "__main__":
    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=die_with_parent, initargs=(os.getpid(),))
    pool.submit(report_and_wait)
    time.sleep(120)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has exited


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_when_the_process_that_started_it_is_killed(tmp_path):
    """Killing experiments.tasks or experiments.compare (SIGKILL: no clean-up runs) must not leave its workers training on."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(ROOT)], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker)
    finally:
        parent.kill()
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_whose_parent_died_before_it_asked_exits_at_once(tmp_path):
    """The request takes effect only once the worker has started; a worker that finds itself orphaned by then
    (its parent's pid is not its parent's any more) exits instead of working."""
    script = tmp_path / "orphan.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                      "from experiments.jobs import die_with_parent\n"
                      "die_with_parent(1)\n"  # pid 1 is not this process's parent
                      "print('still here')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "still here" not in done.stdout


def test_a_job_takes_the_cores_its_pool_frees_between_scoring_batches():
    """FreeCores as scoring's on_batch: nothing while the pool's count is 0; the count once the main process raises
    it; nothing without the callback (scoring reads no process state of its own); and the scores do not change with
    the thread count beyond float rounding."""
    import multiprocessing

    import numpy as np
    import torch

    from eval.scoring import score_windows
    from experiments.jobs import FreeCores
    from model.transformer import Transformer
    from tests.conftest import micro_config

    before = torch.get_num_threads()
    model = Transformer(micro_config(position="rope")).eval()
    windows = np.random.default_rng(0).integers(0, 97, (16, 33))
    shared = multiprocessing.get_context("spawn").Value("i", 0)
    free = FreeCores(shared)
    try:
        torch.set_num_threads(1)
        one_thread = score_windows(model, windows, on_batch=free)
        assert torch.get_num_threads() == 1  # 0: each job keeps its own threads
        shared.value = 2
        score_windows(model, windows)
        assert torch.get_num_threads() == 1  # no callback, no change
        two_threads = score_windows(model, windows, on_batch=free)  # adopts before its first batch
        assert torch.get_num_threads() == 2
        assert np.abs(one_thread - two_threads).max() < 1e-5
    finally:
        torch.set_num_threads(before)


def test_the_worker_layout_follows_the_usable_cores_gpus_and_what_was_asked(monkeypatch):
    from experiments import jobs

    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert jobs.usable_cores() == 4  # the affinity, not every core of the machine
    assert jobs.worker_layout(0, 10) == (4, 1)  # one single-thread worker per core
    assert jobs.worker_layout(0, 3) == (3, 1)  # never more workers than jobs
    assert jobs.worker_layout(1, 10) == (1, 4)  # one worker takes every core
    assert jobs.worker_layout(0, 10, gpus=2) == (2, 2)  # one worker per GPU
    assert jobs.worker_layout(2, 10, threads=1) == (2, 1)  # threads as asked


@pytest.mark.parametrize("gpus, workers", [(4, 6), (1, 8)])
def test_compares_workers_take_one_gpu_each_or_share_one(monkeypatch, gpus, workers):
    """experiments.compare's worker placement with a fake device list (no GPU is needed): worker slot i sets
    CUDA device i mod the device count, so 4 GPUs get one worker each (6 workers: the first two GPUs take a
    second), and 8 workers share 1 GPU (the gpu preset's layout); without workers asked, one per GPU."""
    import queue

    import torch

    from experiments import jobs
    from experiments.compare import running

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(running, "die_with_parent", lambda parent=None: None)
    monkeypatch.setattr(running, "_WORKER", running._WORKER)  # restored after the test
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    slots = queue.Queue()
    for index in range(workers):
        slots.put(index)
    for _ in range(workers):  # each worker process runs the initializer once, taking the next slot
        running._init_worker(slots)
    assert chosen == [index % gpus for index in range(workers)]
    assert sorted(chosen.count(device) for device in range(gpus)) == sorted(
        workers // gpus + (device < workers % gpus) for device in range(gpus))
    assert jobs.worker_layout(0, 25, gpus=gpus) == (gpus, 16 // gpus)  # unasked: one worker per GPU
    assert jobs.worker_layout(workers, 25, gpus=gpus) == (workers, 16 // workers)


def test_how_a_run_executes_never_makes_it_other_settings():
    """A run saved with the chunked loss set explicitly (the default before it followed the device), compiled or not,
    is the same comparison; a setting that changes what is trained is not."""
    from experiments.jobs import comparable

    saved = {"model": {"dim": 64}, "train": {"lr": 3e-3, "fused_loss": True, "compile": False}}
    assert comparable(saved) == comparable({"model": {"dim": 64}, "train": {"lr": 3e-3, "fused_loss": None,
                                                                          "compile": True}})
    assert comparable(saved) != comparable({"model": {"dim": 64}, "train": {"lr": 1e-3, "fused_loss": True}})
