"""A study across machines: the engine's --cluster on a real Ray cluster whose head and worker are separate processes
on this machine (the head offers no CPU, so every cell runs on the worker node), against the local process pool; and
a worker node killed mid-study (integration tier; needs `make cluster-deps`)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The head notices a dead node within seconds, not the minute of its defaults (its health checks and keepalive).
FAST = ('{"health_check_initial_delay_ms":1000,"health_check_period_ms":1000,"health_check_timeout_ms":1000,'
        '"health_check_failure_threshold":3,"grpc_client_keepalive_time_ms":2000,'
        '"grpc_client_keepalive_timeout_ms":2000}')
pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ray_start(*argv: str) -> None:
    subprocess.run([shutil.which("ray") or "ray", "start", "--disable-usage-stats", "--num-gpus=0",
                    "--object-store-memory=200000000", *argv], check=True, capture_output=True, timeout=180,
                   env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})


def start_worker(address: str, temp: Path) -> None:
    ray_start(f"--address={address}", "--num-cpus=2", f"--temp-dir={temp}")


def kill_node(temp: Path) -> int:
    """SIGKILL every process of the node whose --temp-dir is `temp` and their children: its machine dies."""
    import psutil

    roots = [p for p in psutil.process_iter(["pid", "cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
    victims = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    for process in victims.values():
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(victims.values()), timeout=5)
    return len(victims)


@pytest.fixture
def cluster(tmp_path_factory):
    """A head (no CPUs) and one worker node (2 CPUs) as separate processes; their address and the worker's temp
    folder. Stops every Ray process at the end."""
    pytest.importorskip("ray", reason="needs Ray: make cluster-deps")
    pytest.importorskip("psutil", reason="needs psutil (installed with accelerate: make install)")
    base = Path("/tmp") / f"pelab-ray-{os.getpid()}"  # short: Ray's sockets live under it
    port = free_port()
    address = f"127.0.0.1:{port}"
    subprocess.run([shutil.which("ray") or "ray", "stop", "--force"], capture_output=True, timeout=120)
    try:
        ray_start("--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=0",
                  "--include-dashboard=false", f"--temp-dir={base / 'head'}", f"--system-config={FAST}")
        start_worker(address, base / "worker")
        yield address, base / "worker"
    finally:
        subprocess.run([shutil.which("ray") or "ray", "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def study(out: Path, *argv: str, wait: bool = True):
    """The micro study (tests/toy_study.py) in a process of its own, as a user runs it from the repository root."""
    command = [sys.executable, "-c", "import sys; from experiments.engine import main; "
               "sys.exit(main('tests.toy_study', sys.argv[1:]))", "--out", str(out), "--threads", "1", *argv]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if wait:
        output, _ = process.communicate(timeout=600)
        return process.returncode, output
    return process


def records(out: Path) -> dict[str, dict]:
    return {stored["cell"]["name"]: stored["record"] for stored in
            (json.loads(p.read_text()) for p in sorted((out / "records").glob("*.json")))}


def test_a_study_on_a_ray_cluster_gives_the_records_and_report_of_the_local_pool(cluster, tmp_path):
    address, _ = cluster
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert study(local, "--workers", "2", "--cells", "6")[0] == 0
    code, output = study(remote, "--cluster", address, "--cells", "6")
    assert code == 0, output
    assert records(remote) == records(local) and len(records(local)) == 6
    assert (remote / "report.md").read_text() == (local / "report.md").read_text()
    [log] = [json.loads(line) for line in (remote / "invocations.jsonl").read_text().splitlines()]
    assert log["where"].startswith(f"Ray cluster at {address} (2 nodes, 2 CPUs)") and log["measured"] == 6


def test_a_worker_killed_mid_study_loses_no_finished_record_and_the_study_completes_on_resume(cluster, tmp_path):
    address, worker = cluster
    out = tmp_path / "killed"
    driver = study(out, "--cluster", address, "--cells", "8", "--sleep", "4", wait=False)
    deadline = time.monotonic() + 300
    while len(list((out / "records").glob("*.json"))) < 2:
        assert time.monotonic() < deadline and driver.poll() is None, "no record within 5 minutes"
        time.sleep(0.2)
    before = {p.name: p.read_bytes() for p in (out / "records").glob("*.json")}
    assert kill_node(worker) > 0
    output, _ = driver.communicate(timeout=300)
    assert driver.returncode == 1, output  # the cells it lost are failures of this invocation
    assert "FAILED: task lost" in output or "FAILED: no live node" in output
    after = {p.name: p.read_bytes() for p in (out / "records").glob("*.json")}
    assert all(after[name] == data for name, data in before.items())  # nothing finished was lost or rewritten
    assert len(after) < 8
    start_worker(address, worker)
    code, output = study(out, "--cluster", address, "--cells", "8", "--sleep", "4")
    assert code == 0, output
    complete = records(out)
    assert sorted(complete) == [f"c{i}" for i in range(8)]
    assert all(record["square"] == int(name[1:]) ** 2 for name, record in complete.items())
    logs = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert logs[0]["failed"] > 0 and logs[-1]["measured"] == 8 - len(after) and logs[-1]["failed"] == 0
