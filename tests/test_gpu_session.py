"""The GPU session (experiments/gpu_lease/session.py) and what its calls carry (experiments/gpu_lease/carry.py),
without a GPU: the runner (steps in order, each under its limit, each packed into OUT as it ends, a failure or a
time-out recorded and the next step run), every device command parsed by its own command's parser, the limits against
a device call and a lease, the GGUF parts; and, in the integration tier, the whole --dry-run on this CPU at a micro
scale."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import time

import pytest
import torch

import experiments.gpu_lease.session as gs
from errors import ConfigError
from experiments.gpu_lease import carry as gpu_carry
from tests.conftest import ROOT
from tests.test_docs import parser_of

PY = sys.executable
SESSION_SH = ROOT / "experiments" / "gpu_lease" / "session.sh"  # what a device call runs


def archived(archive):
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def returned_files_ok(out):
    """What the device tool returns: at most 8 files, 16 MiB each, names of letters, digits, '.', '_', '-'."""
    files = [path for path in out.rglob("*") if path.is_file()]
    return len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", path.name) and path.stat().st_size < 16 * 2**20
                                   for path in files)


def test_a_command_past_its_limit_is_interrupted_and_its_output_so_far_kept(tmp_path):
    started = time.perf_counter()
    result = gs.run_command([PY, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                            tmp_path / "slow.log", limit_s=2)
    assert result["timed_out"] and result["rc"] != 0
    assert time.perf_counter() - started < 20
    assert "started" in (tmp_path / "slow.log").read_text()


def test_steps_run_in_order_each_packed_as_it_ends_and_a_failure_does_not_stop_the_next(tmp_path, monkeypatch):
    def writes(s):
        (s.folder() / "result.json").write_text("{}")
        (s.folder() / "weights.safetensors").write_bytes(b"0" * 100)  # weights never go back
        s.run("ok", [PY, "-c", "print('fine')"])

    def raises(s):
        (s.folder() / "partial.md").write_text("what it did before failing")
        raise RuntimeError("broken on purpose")

    def exits(s):
        s.run("bad", [PY, "-c", "raise SystemExit(3)"])
        s.run("after", [PY, "-c", "print('the step goes on')"])

    def skips(s):
        raise gs.StepSkipped("nothing to run it on")

    def sleeps(s):
        s.run("slow", [PY, "-c", "import time; time.sleep(60)"])

    bodies = {"a": writes, "b": raises, "c": exits, "d": skips, "e": sleeps}
    monkeypatch.setattr(gs, "LIMITS", {"a": 60, "b": 60, "c": 60, "d": 60, "e": 2})
    monkeypatch.setattr(gs, "MIN_START_S", 0.5)
    session = gs.Session(tmp_path / "out", tmp_path / "work", tmp_path / "carry", dry=True)
    (tmp_path / "out").mkdir()
    for name, body in bodies.items():
        session.run_step(name, body)
        assert (tmp_path / "out" / f"{name}.tar.gz").exists()  # as soon as the step ends
    record = json.loads((tmp_path / "out" / "session.json").read_text())
    assert list(record["steps"]) == list(bodies)
    statuses = {name: step["status"] for name, step in record["steps"].items()}
    assert statuses == {"a": "ok", "b": "failed", "c": "failed", "d": "skipped", "e": "timed out"}
    assert "broken on purpose" in record["steps"]["b"]["reason"] and "bad" in record["steps"]["c"]["reason"]
    assert [c["name"] for c in record["steps"]["c"]["commands"]] == ["bad", "after"]
    assert record["steps"]["e"]["commands"][0]["timed_out"] and record["steps"]["e"]["seconds"] < 20
    assert archived(tmp_path / "out" / "a.tar.gz") == ["a/ok.log", "a/result.json", "a/step.json"]
    assert "b/partial.md" in archived(tmp_path / "out" / "b.tar.gz")
    assert returned_files_ok(tmp_path / "out")


def test_a_pytest_commands_summary_line_is_recorded(tmp_path):
    (tmp_path / "tests.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    assert False\n")
    session = gs.Session(tmp_path / "out", tmp_path / "work", tmp_path / "carry", dry=True)
    session.step, session.deadline = "suite", time.perf_counter() + 120
    result = session.run("unit", [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "tests.py")])
    assert not result["ok"] and re.match(r"1 failed, 1 passed in [\d.]+s", result["summary"])


def test_a_step_packs_what_fits_what_the_device_tool_returns(tmp_path, monkeypatch):
    folder = tmp_path / "step"
    folder.mkdir()
    for name, size in (("small.json", 10), ("mid.log", 3000), ("large.md", 6000), ("tokenizer.json", 10)):
        (folder / name).write_bytes(b"x" * size)
    (folder / "evals.npz").write_bytes(b"x" * 10)
    monkeypatch.setattr(gs, "LARGEST_KEPT", 5000)
    monkeypatch.setattr(gs, "LARGEST_ARCHIVE", 2000)
    packed = gs.pack(folder, tmp_path / "out" / "step.tar.gz")
    assert archived(tmp_path / "out" / "step.tar.gz") == ["step/small.json"]
    assert sorted(packed["left_out"]) == ["large.md", "mid.log"]  # too large alone; then past the archive's size


def device_plan(tmp_path, monkeypatch, dry: bool) -> list[list[str]]:
    """Every command the steps would run (nothing is run): a carry holding all they look for."""
    carry = tmp_path / "carry"
    for folder, name, text in (("data", "meta.json", '{"source": "books", "val_fraction": 0.15}'),
                               ("quick_data", "meta.json", '{"source": "stdlib", "val_fraction": 0.05}'),
                               ("book", "book.txt", "text"), ("smollm2", "config.json", "{}")):
        (carry / folder).mkdir(parents=True, exist_ok=True)
        (carry / folder / name).write_text(text)
    session = gs.Session(tmp_path / "out", tmp_path / "work", carry, dry=dry)
    (tmp_path / "out").mkdir(exist_ok=True)
    commands = []

    def record(self, name, argv, limit_s=None, ok=(0,)):
        commands.append(argv)
        result = {"name": name, "command": " ".join(argv), "rc": 0, "seconds": 0.0, "timed_out": False, "ok": True}
        self.commands.append(result)
        return result

    monkeypatch.setattr(gs.Session, "run", record)
    for step in gs.STEPS:
        assert session.run_step(step, gs.BODIES[step])["status"] == "ok", step
    return commands


@pytest.mark.parametrize("dry", [False, True], ids=["device", "dry-run"])
def test_every_command_of_the_session_parses_with_its_commands_own_parser(tmp_path, monkeypatch, dry):
    """The device's commands cannot run here: each is parsed as `python -m MODULE` would parse it, so a flag that
    does not exist (or was renamed) fails here and not in a lease."""
    commands = device_plan(tmp_path, monkeypatch, dry)
    ours = [argv[2:] for argv in commands if argv[1:2] == ["-m"] and argv[2].split(".")[0] in
            {"scripts", "experiments", "eval"}]
    modules = {argv[0] for argv in ours}
    assert {"scripts.bench", "scripts.encoding_costs", "experiments.performance.flex_costs",
            "experiments.performance.attention_paths", "experiments.compare", "experiments.sweep",
            "experiments.real_model"} <= modules
    for module, *args in ours:
        _, unknown = parser_of(module).parse_known_args(args)
        overrides = module.startswith("experiments.") and all(re.match(r"--\w+(\.\w+)+=", word) for word in unknown)
        assert not unknown or overrides, (module, unknown)
    bench = [args for module, *args in ours if module == "scripts.bench"]
    assert [args[args.index("--shape") + 1] for args in bench] == (["micro"] if dry else ["research6", "research8",
                                                                                      "tiny"])
    suites = [argv for argv in commands if argv[1:3] == ["-m", "pytest"]]
    assert suites[0][3] == "tests/test_cuda.py" and any("--junitxml" in word for word in suites[1])
    if not dry:
        assert all("--device" not in args or args[args.index("--device") + 1] == "cuda" for _, *args in ours)


def test_the_steps_fit_a_device_call_in_order_of_value():
    """Each call within a device command's 10 minutes; a lease of 15 runs the first calls side by side with
    --limits (docs/performance.md)."""
    for steps, _ in gpu_carry.CALLS:
        assert sum(gs.LIMITS[step] for step in steps) + 60 <= 600  # a device command's limit, with a margin
    assert [step for steps, _ in gpu_carry.CALLS for step in steps] == gs.STEPS  # every step, in order of value


def test_the_gguf_parts_fill_the_calls_room_and_reassemble_to_the_checked_file(tmp_path, monkeypatch):
    mib = 2**20
    assert gpu_carry.plan_parts(3 * mib, [mib, mib // 2, 10 * mib, 5 * mib]) == [mib, mib // 2, 3 * mib // 2, 0]
    with pytest.raises(ConfigError, match="does not fit"):
        gpu_carry.plan_parts(3 * mib, [mib, mib])
    whole = bytes(range(256)) * (3 * mib // 256)
    (tmp_path / "model.gguf").write_bytes(whole)
    carry = tmp_path / "carry"
    assert gpu_carry.split_gguf(tmp_path / "model.gguf", [mib, 0, 2 * mib], carry) == ["gguf-1", "gguf-2"]
    session = gs.Session(tmp_path / "out", tmp_path / "work", carry, dry=True)
    session.step = "real_model"
    imported = []

    def fake_import(self, name, module, *args, **kwargs):  # the reassembled file, as the importer would read it
        imported.append((module, (tmp_path / "work" / "real_model" / "model.gguf").read_bytes()))
        return {"rc": 0}

    monkeypatch.setattr(gs.Session, "module", fake_import)
    monkeypatch.setattr(gs, "ROOT", tmp_path)  # no runs/smollm2 of this checkout is found
    assert gs.smollm2(session) == tmp_path / "runs" / "smollm2"
    assert imported == [("scripts.import_hf", whole)]
    part = carry / "gguf-2" / "part-2"
    part.write_bytes(b"!" + part.read_bytes()[1:])  # a part damaged on the way
    with pytest.raises(ConfigError, match="differs from the original"):
        gs.smollm2(session)
    part.unlink()  # a part that never arrived (the machine was given back between calls)
    with pytest.raises(gs.StepSkipped, match=r"\['gguf-2'\] are not on this machine"):
        gs.smollm2(session)


def test_without_carried_data_or_model_the_steps_say_what_to_carry(tmp_path, monkeypatch):
    session = gs.Session(tmp_path / "out", tmp_path / "work", tmp_path / "carry", dry=True)
    session.step = "preset"
    with pytest.raises(gs.StepSkipped, match="make gpu-carry"):
        gs.preset(session)
    session.step = "sweep"
    with pytest.raises(gs.StepSkipped, match="make gpu-carry.*quick_data"):
        gs.sweep(session)
    monkeypatch.setattr(gs, "ROOT", tmp_path)  # not this checkout's runs/smollm2, if it has imported one
    with pytest.raises(gs.StepSkipped, match="over the 64 MiB a call carries"):
        gs.smollm2(session)
    assert gs.main(["nosuchstep", "--dry-run"]) == 2  # one line naming the steps
    if not torch.cuda.is_available():  # the device mode on a machine without a GPU says how to go on
        with pytest.raises(ConfigError, match="no CUDA device here.*--dry-run"):
            gs.Session(tmp_path / "out", tmp_path / "work", tmp_path / "carry", dry=False).setup()


@pytest.mark.integration  # the six steps for real, at a micro scale: about 3 min on an idle 2-core CPU
def test_the_dry_run_goes_through_every_step_and_a_failed_step_does_not_stop_the_next(small_text_file, tmp_path):
    from data.tokenizer import load_tokenizer
    from model import Transformer
    from model.checkpoint import save_checkpoint
    from tests.conftest import micro_config

    books = tmp_path / "books"
    books.mkdir()
    for index, part in enumerate(small_text_file.read_text().split("<|endoftext|>")[:6]):
        (books / f"book{index}.txt").write_text(part)
    carry = tmp_path / "carry"
    assert gpu_carry.main(["--books", str(books), "--book-file", "book0.txt", "--gguf", "none", "--no-wheels",
                           "--vocab-size", "512", "--quick-source", str(books), "--out", str(carry)]) == 0
    calls = json.loads((carry / "calls.json").read_text())["calls"]
    assert calls[1]["carry"][-1].endswith("quick_data") and calls[3]["carry"][-1].endswith("data")
    tokenizer = load_tokenizer(carry / "data")  # a micro checkpoint stands in for SmolLM2
    save_checkpoint(carry / "smollm2", Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=16)),
                    tokenizer, {"trained_seq_len": 16, "step": 0})
    out, work = tmp_path / "out", tmp_path / "work"
    environment = {"PATH": "/usr/bin:/bin", "OUT": str(out), "DRY_RUN": "1", "PYTHON": PY, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(SESSION_SH), "--work", str(work), "--carry",
                           str(carry)], env=environment, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((out / "session.json").read_text())
    assert list(record["steps"]) == gs.STEPS and {s["status"] for s in record["steps"].values()} == {"ok"}
    expected = {"suite": ["suite/cuda.xml", "suite/fast.xml"], "sweep": ["sweep/sweep_lr/sweep.md"],
                "bench": ["bench/bench-micro.json"],
                "costs": ["costs/encoding_costs.json", "costs/encoding_costs-flex.json", "costs/flex_costs.json",
                          "costs/paths_flex_cuda/attention_paths.json"],
                "preset": ["preset/compare_gpu/report.md", "preset/compare_gpu/results.json"],
                "real_model": ["real_model/real_model/results.json", "real_model/real_model/report.md"]}
    for step, files in expected.items():
        assert set(files) <= set(archived(out / f"{step}.tar.gz")), step
    results = json.loads((work / "preset" / "compare_gpu" / "results.json").read_text())
    assert sorted(results["settings"]["compare"]["seeds"]) == [1, 2]  # the second stage: every seed
    assert returned_files_ok(out)
    # The preset's data not carried: that step is skipped with the reason, and the real model after it still runs.
    for path in (carry / "data").iterdir():
        path.unlink()
    out2 = tmp_path / "out2"
    done = subprocess.run(["bash", str(SESSION_SH), "preset", "real_model", "--work",
                           str(tmp_path / "work2"), "--carry", str(carry)], env={**environment, "OUT": str(out2)},
                          capture_output=True, text=True, timeout=600)
    record = json.loads((out2 / "session.json").read_text())
    assert done.returncode == 1 and record["steps"]["preset"]["status"] == "skipped"
    assert "make gpu-carry" in record["steps"]["preset"]["reason"]
    assert record["steps"]["real_model"]["status"] == "ok"
    assert "real_model/real_model/results.json" in archived(out2 / "real_model.tar.gz")


def test_a_call_sets_its_steps_limits_and_the_suites_xdist_workers(tmp_path, monkeypatch, capsys):
    assert gs.main(["--dry-run", "--limits", "suit=3", "--out", str(tmp_path / "out")]) == 2
    assert "must look like STEP=SECONDS" in capsys.readouterr().err and not (tmp_path / "out").exists()
    ran = []
    monkeypatch.setattr(gs.Session, "run", lambda self, name, argv, limit_s=None, ok=(0,): ran.append(
        (self.step, round(self.left()), argv)) or {"ok": True})
    monkeypatch.setitem(gs.BODIES, "suite", gs.suite)
    assert gs.main(["suite", "--dry-run", "--limits", "suite=40", "--suite-workers", "3", "--out",
                    str(tmp_path / "out"), "--work", str(tmp_path / "work")]) == 0
    assert all(step == "suite" and 35 <= left <= 40 for step, left, _ in ran)  # this call's limit, not LIMITS'
    fast = ran[-1][2]
    assert fast[fast.index("-n") + 1] == "3" and fast[fast.index("--dist") + 1] == "loadfile"


def test_a_cut_off_suite_still_names_its_failures(tmp_path):
    """xdist's verbose lines name a failure as it happens; pytest's closing list names it again (counted once)."""
    log = tmp_path / "fast.log"
    log.write_text("[gw2] [ 39%] PASSED tests/test_flex.py::test_one\n"
                   "[gw5] [ 40%] FAILED tests/test_loss.py::test_two[t5]\n"
                   "[gw1] [ 41%] ERROR tests/test_jobs.py::test_three\n"
                   "FAILED tests/test_loss.py::test_two[t5] - AssertionError: x\n")
    assert gs.pytest_failures(log) == ["tests/test_loss.py::test_two[t5]", "tests/test_jobs.py::test_three"]
    log.write_text("........ [100%]\n3 passed in 1.0s\n")
    assert gs.pytest_failures(log) == [] and gs.pytest_failures(tmp_path / "absent.log") == []
