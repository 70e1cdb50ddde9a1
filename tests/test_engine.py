"""The study engine (experiments/engine.py) on a micro study (tests/toy_study.py): content-addressed records, the
lock that lets two processes share a study, resume, the deadline, the invocation log, --report-only, settings from
defaults, a config, a preset, overrides and flags, and a local process pool that gives the records one process gives."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import engine
from experiments.engine import claim, key, load_records, main

ROOT = Path(__file__).resolve().parents[1]
TOY = engine.importlib.import_module("tests.toy_study").STUDY


def run_toy(out: Path, *argv: str) -> int:
    return main("tests.toy_study", ["--out", str(out), "--workers", "1", *argv])


def records_of(out: Path) -> dict[str, dict]:
    """cell name -> its record, for every record in OUT/records."""
    return {stored["cell"]["name"]: stored["record"]
            for stored in (json.loads(p.read_text()) for p in (out / "records").glob("*.json"))}


def test_a_cell_is_addressed_by_what_it_is_not_where_its_inputs_lie():
    cell = {"name": "a", "value": 1, "local": {"path": "/here"}}
    assert key(cell) == key({**cell, "local": {"path": "/elsewhere"}})
    assert key(cell) != key({**cell, "value": 2})
    assert key({"b": 1, "a": 2}) == key({"a": 2, "b": 1})  # the order keys were written in does not matter
    assert len(key(cell)) == 16 and int(key(cell), 16) >= 0


def test_a_study_writes_a_record_per_cell_logs_the_invocation_and_renders(tmp_path):
    out = tmp_path / "toy"
    assert run_toy(out) == 0
    assert {name: record["square"] for name, record in records_of(out).items()} == {"c0": 0, "c1": 1, "c2": 4, "c3": 9}
    study = json.loads((out / "study.json").read_text())
    assert study["study"] == "tests.toy_study" and [c["name"] for c in study["cells"]] == ["c0", "c1", "c2", "c3"]
    for listed, cell in zip(study["cells"], load_records(TOY, out).cells):  # a measured cell is listed by its key
        assert listed == {"name": cell["name"], "key": key(cell)} and (out / "records" / f"{key(cell)}.json").exists()
    [log] = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert log["measured"] == 4 and log["failed"] == 0 and log["left"] == 0
    assert log["machine"] == engine.machine() and log["command"].startswith("python -m tests.toy_study --out ")
    assert (out / "report.md").read_text() == "c0: 0\nc1: 1\nc2: 4\nc3: 9\n"


def test_a_rerun_measures_only_what_has_no_record_and_a_changed_setting_makes_new_cells(tmp_path):
    out = tmp_path / "toy"
    assert run_toy(out, "--cells", "2") == 0
    first = {p.name: p.stat().st_mtime_ns for p in (out / "records").glob("*.json")}
    assert run_toy(out, "--cells", "3") == 0
    after = {p.name: p.stat().st_mtime_ns for p in (out / "records").glob("*.json")}
    assert len(after) == 3 and all(after[name] == mtime for name, mtime in first.items())  # not measured again
    assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["measured"] == 1
    assert run_toy(out, "--cells", "3", "--scale", "10") == 0  # every cell changed: three new records
    assert len(list((out / "records").glob("*.json"))) == 6
    assert (out / "report.md").read_text() == "c0: 0\nc1: 10\nc2: 40\n"  # the report reads the cells asked for


def test_the_deadline_starts_no_cell_and_a_rerun_continues(tmp_path, capsys):
    out = tmp_path / "toy"
    assert run_toy(out, "--minutes", "0") == 0
    assert not list((out / "records").glob("*.json"))
    assert "4 cell(s) not measured" in capsys.readouterr().out
    assert json.loads((out / "invocations.jsonl").read_text())["left"] == 4
    assert run_toy(out) == 0 and len(records_of(out)) == 4


def test_a_failed_cell_is_reported_and_the_others_are_kept(tmp_path, capsys):
    out = tmp_path / "toy"
    assert run_toy(out, "--fail", "1,2") == 1
    assert sorted(records_of(out)) == ["c0", "c3"]
    assert "c1: FAILED: ValueError: cell c1 fails on purpose" in capsys.readouterr().out
    assert json.loads((out / "invocations.jsonl").read_text())["failed"] == 2


def test_a_cell_another_process_holds_is_left_to_it(tmp_path):
    out = tmp_path / "toy"
    run_toy(out, "--minutes", "0")  # declares the cells
    cells = load_records(TOY, out).cells
    with claim(out, key(cells[0])) as mine:
        assert mine
        assert run_toy(out) == 0
        assert sorted(records_of(out)) == ["c1", "c2", "c3"]
        assert json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["held elsewhere"] == 1
    assert run_toy(out) == 0 and sorted(records_of(out)) == ["c0", "c1", "c2", "c3"]


def test_two_processes_share_one_study_and_measure_each_cell_once(tmp_path):
    out = tmp_path / "toy"
    command = [sys.executable, "-c", "import sys; from experiments.engine import main; "
               f"sys.exit(main('tests.toy_study', ['--out', {str(out)!r}, '--workers', '1', '--cells', '6', "
               "'--sleep', '0.5']))"]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL) for _ in range(2)]
    assert [p.wait(timeout=300) for p in processes] == [0, 0]
    logs = [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]
    assert sum(log["measured"] for log in logs) == 6 and len(records_of(out)) == 6
    assert all(log["measured"] > 0 for log in logs)  # each process took some of the cells


def test_report_only_renders_from_the_records_alone(tmp_path):
    out = tmp_path / "toy"
    assert run_toy(out) == 0
    (out / "report.md").unlink()
    assert main("tests.toy_study", ["--report-only", "--out", str(out)]) == 0
    assert (out / "report.md").read_text() == "c0: 0\nc1: 1\nc2: 4\nc3: 9\n"
    records = load_records(engine.importlib.import_module("tests.toy_study").STUDY, out)
    assert records.settings.cells == 4 and len(records.done()) == 4 and not records.missing()


def test_a_setting_given_with_report_only_replaces_the_stored_one_for_that_rendering(tmp_path):
    out = tmp_path / "toy"
    assert run_toy(out) == 0
    stored = (out / "study.json").read_text()
    assert main("tests.toy_study", ["--report-only", "--out", str(out), "--title", "squares"]) == 0
    assert (out / "report.md").read_text() == "# squares\nc0: 0\nc1: 1\nc2: 4\nc3: 9\n"
    assert (out / "study.json").read_text() == stored  # the study as declared is unchanged


def test_report_only_on_a_folder_without_a_study_names_the_fix(tmp_path, capsys):
    assert main("tests.toy_study", ["--report-only", "--out", str(tmp_path / "empty")]) == 2
    assert "holds no study" in capsys.readouterr().err


def test_settings_come_from_defaults_config_preset_overrides_and_flags_in_that_order(tmp_path):
    config = tmp_path / "toy.toml"
    config.write_text('[toy]\ncells = 5\nscale = 2\n[table]\na = 1\n'
                      '[presets.big]\n"toy.cells" = 7\n"table.b" = 2\n')
    study = engine.importlib.import_module("tests.toy_study").STUDY
    parser = engine.build_parser(study)

    def resolved(*argv: str):
        args, overrides = parser.parse_known_args(list(argv))
        return engine.resolve_settings(study, args, overrides)

    assert resolved().cells == 4
    assert (resolved("--config", str(config)).cells, resolved("--config", str(config)).scale) == (5, 2)
    settings = resolved("--config", str(config), "--preset", "big")
    assert (settings.cells, settings.table) == (7, {"a": 1, "b": 2})
    assert resolved("--config", str(config), "--preset", "big", "--toy.cells=8").cells == 8
    assert resolved("--config", str(config), "--toy.cells=8", "--cells", "9").cells == 9
    assert resolved("--fail", "1,3").fail == [1, 3]


@pytest.mark.parametrize("argv, message", [
    (["--preset", "big"], "give --config too"),
    (["--toy.celz=3"], "unknown key(s) ['celz']"),
    (["--other.cells=3"], "sets no setting of toy"),
    (["--cels", "3"], "did you mean --cells"),
])
def test_bad_settings_are_refused_with_the_fix(argv, message, tmp_path, capsys):
    assert main("tests.toy_study", ["--out", str(tmp_path / "t"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_local_pool_gives_the_records_one_process_gives(tmp_path):
    one, pool = tmp_path / "one", tmp_path / "pool"
    assert run_toy(one, "--threads", "1") == 0
    assert main("tests.toy_study", ["--out", str(pool), "--workers", "2", "--threads", "1"]) == 0
    assert records_of(one) == records_of(pool)
    assert (one / "report.md").read_text() == (pool / "report.md").read_text()
    assert "2 local processes" in json.loads((pool / "invocations.jsonl").read_text())["where"]
