"""The study engine's local workers (experiments/engine.py): each dies with the process that started it, even
SIGKILLed (die_with_parent), a worker slot picks its GPU, and each cell's threads follow the usable cores."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments import engine

ROOT = Path(__file__).resolve().parents[1]
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = '''
import concurrent.futures, multiprocessing, os, sys, time
sys.path.insert(0, sys.argv[1])
from experiments.engine import die_with_parent

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


def children(pid: int) -> set[int]:
    """The processes `pid` started (any of its threads)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def wait_until_gone(pids: set[int], seconds: float = 20) -> set[int]:
    """The processes of `pids` still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {pid for pid in pids if alive(pid)}


@LINUX
def test_a_worker_dies_when_the_process_that_started_it_is_killed(tmp_path):
    """Killing a study's process (SIGKILL: no clean-up runs) must not leave its workers measuring on."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(ROOT)], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(parent.stdout.readline())
        assert alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert not wait_until_gone({worker})
    finally:
        parent.kill()
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)


@LINUX
def test_a_worker_whose_parent_died_before_it_asked_exits_at_once(tmp_path):
    """The request takes effect only once the worker has started; a worker that finds itself orphaned by then
    (its parent's pid is not its parent's any more) exits instead of working."""
    script = tmp_path / "orphan.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                      "from experiments.engine import die_with_parent\n"
                      "die_with_parent(1)\n"  # pid 1 is not this process's parent
                      "print('still here')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "still here" not in done.stdout


@LINUX
def test_the_local_pools_workers_die_with_a_killed_study(tmp_path):
    """A study measuring its cells in two worker processes, SIGKILLed while they measure: no worker goes on."""
    out = tmp_path / "toy"
    study = subprocess.Popen([sys.executable, "-c", "import sys; from experiments.engine import main; sys.exit(main("
                              f"'tests.toy_study', ['--out', {str(out)!r}, '--workers', '2', '--threads', '1', "
                              "'--cells', '2', '--sleep', '120']))"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        logs = [out / "work" / "logs" / f"c{i}.log" for i in range(2)]
        deadline = time.monotonic() + 120
        while not all(log.exists() and "=== c" in log.read_text() for log in logs):  # both cells are measuring
            assert study.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers = children(study.pid)
        assert len(workers) >= 2
        study.send_signal(signal.SIGKILL)
        study.wait()
        assert not wait_until_gone(workers)
        assert not list((out / "records").glob("*.json"))  # nothing half-measured was written
    finally:
        study.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("gpus, workers", [(4, 6), (1, 8)])
def test_workers_take_one_gpu_each_or_share_one(monkeypatch, gpus, workers):
    """The local pool's worker placement with a fake device list (no GPU is needed): worker slot i sets CUDA device
    i mod the device count, so 4 GPUs get one worker each (6 workers: the first two GPUs take a second), and 8
    workers share 1 GPU (the gpu preset's layout)."""
    import queue

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(engine, "die_with_parent", lambda parent: None)
    slots = queue.Queue()
    for index in range(workers):
        slots.put(index)
    for _ in range(workers):  # each worker process runs the initializer once, taking the next slot
        engine._start_worker(slots, os.getpid())
    assert chosen == [index % gpus for index in range(workers)]
    assert sorted(chosen.count(device) for device in range(gpus)) == sorted(
        workers // gpus + (device < workers % gpus) for device in range(gpus))


def test_the_usable_cores_are_the_affinitys_and_one_worker_takes_them_all(monkeypatch, tmp_path):
    monkeypatch.setattr(engine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert engine.usable_cores() == 4  # the affinity, not every core of the machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = torch.get_num_threads()
    try:
        def threads(out: Path, *argv: str) -> set[int]:
            assert engine.main("tests.toy_study", ["--out", str(out), "--cells", "2", *argv]) == 0
            return {json.loads(path.read_text())["record"]["threads"] for path in (out / "records").glob("*.json")}

        assert threads(tmp_path / "one", "--workers", "1") == {4}  # one worker: every usable core
        assert threads(tmp_path / "asked", "--workers", "1", "--threads", "2") == {2}  # threads as asked
    finally:
        torch.set_num_threads(before)
