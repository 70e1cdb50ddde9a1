"""experiments.compare on the study engine at micro scale: its settings and cells, one cell measured, the failures it
reports, what a second invocation in the same folder does, and whole comparisons: seeds, snapshots and a rerun,
named variants, the use probe on kept models; in the integration tier workers, a run killed and resumed, two
processes on one study, every probe and a task, the map and frontier2 presets. The report's words are tested in
tests/test_compare_report.py."""
import copy
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from data.prepare import prepare as prepare_data
from errors import ConfigError
from experiments import compare, engine
from experiments.compare import STUDY, Settings, cells, comparable, measure, run_folder
from experiments.engine import Context, key, load_records, main
from tests.conftest import ROOT
from train.config import build_run_config

MICRO = ["--model.dim=32", "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1",
         "--model.max_seq_len=16", "--train.max_steps=6", "--train.batch_size=4", "--train.eval_interval=3",
         "--train.eval_batches=1", "--train.log_interval=2", "--compare.vocab_size=300",
         "--compare.eval_tokens=512", "--compare.methods=yarn,dynamic,clamp", "--compare.lengths=1x,2x,4x",
         "--compare.seeds=1", "--compare.probes="]  # the quick preset's use probe runs in the probes test below
ENCODINGS = ["none", "sinusoidal", "learned", "shaw", "t5", "alibi", "rope"]
EVERY = "--compare.encodings=" + ",".join(ENCODINGS)  # the quick preset's and learned


def arguments(source, out, *extra):
    """A micro comparison on the quick preset in this process, one cell at a time (`extra` overrides)."""
    return ["--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick", "--out", str(out),
            f"--compare.source={source}", "--compare.val_fraction=0.3", *MICRO, "--workers", "1", "--threads", "1",
            *extra]


def settings_of(*argv: str) -> Settings:
    """The settings engine.main would resolve from `argv` (nothing runs)."""
    parser = engine.build_parser(STUDY)
    args, overrides = parser.parse_known_args(list(argv))
    return engine.resolve_settings(STUDY, args, overrides)


def stored(out: Path) -> dict[str, dict]:
    """key -> the stored record (cell, record, seconds, machine) of every record in OUT/records."""
    return {path.stem: json.loads(path.read_text()) for path in sorted((out / "records").glob("*.json"))}


def by_name(out: Path) -> dict[str, dict]:
    """cell name -> its record, for the cells the last invocation declared."""
    declared = load_records(STUDY, out).cells
    found = stored(out)
    return {cell["name"]: found[key(cell)]["record"] for cell in declared if key(cell) in found}


def invocations(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "invocations.jsonl").read_text().splitlines()]


def table_labels(out: Path) -> set[str]:
    """The row labels of the perplexity table."""
    text = (out / "table.md").read_text().split("### Extrapolation penalty")[0]
    return {line.split(" | ")[0].strip("| ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")}


@pytest.fixture(scope="session")
def compare_data(small_text_file, tmp_path_factory) -> Path:
    """OUT/work/data as a comparison of `arguments` prepares it from small_text_file, prepared once."""
    data = tmp_path_factory.mktemp("compare_data") / "data"
    prepare_data(str(small_text_file), data, vocab_size=300, val_fraction=0.3)
    return data


def study_folder(tmp_path: Path, compare_data: Path) -> Path:
    """An empty study folder whose data is prepared already (the comparison finds it and prepares nothing)."""
    out = tmp_path / "cmp"
    shutil.copytree(compare_data, out / "work" / "data")
    return out


def run_config(cell: dict, out: Path):
    """The run config measure() trains for `cell` in the study folder `out`."""
    values = copy.deepcopy(cell["run"])
    values["train"].update(cell["local"]["train"])
    return build_run_config({**values, "data": {"dir": str(out / "work" / "data")},
                             "out": {"dir": str(run_folder(out / "work", cell))}}, cell["name"])


# ----------------------------------------------------------------------------------------------- settings

@pytest.mark.parametrize("override, message", [
    ("--compare.encodings=rope,alibl", "compare.encodings / train_settings: unknown or repeated ['alibl']"),
    ("--compare.encodings=rope,rope", "unknown or repeated ['rope', 'rope']"),
    ('--compare.variants={rope = {position = "alibi"}}', "compare.variants.rope"),
    ("--compare.variants={mine = {position_args = {rope = {p = 0.5}}}}", "compare.variants.mine"),
    (('--compare.variants={mine = {position = "rope", position_args = {rope = {p = 2.0}}}}',
      "--compare.encodings=rope,mine"), "p in [0, 1]"),
    (("--compare.encodings=rope,partial-rope", "--model.n_heads=16"), "rotates 0 of the 2 dimensions"),
    ("--compare.methods=yarn,rerope2", "unknown inference-time method"),
    ("--compare.methods=yarn+linear", "at most one RoPE scaling"),
    ("--compare.encoding_settings={t5 = {t5_max_distance = 64}}", "unknown key(s) ['encoding_settings']"),
    ((EVERY, "--model.position_args.t5.max_distanc=64"), "unknown setting(s) ['max_distanc']"),
    ("--compare.seeds=1,1", "distinct integers"),
    ("--compare.snapshots=1.5", "fractions of training"),
    ((EVERY, "--model.position_args.learned.max_positions=8"), "beyond the learned table of 8 positions"),
    (("--compare.probes=use", "--compare.use_windows=100000"), "lower use_windows to"),
])
def test_bad_settings_are_refused_before_anything_trains(compare_data, small_text_file, tmp_path, capsys, override,
                                                         message):
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, *(
        [override] if isinstance(override, str) else override))) == 2
    error = capsys.readouterr().err
    assert error.startswith("error:") and message in error and "Traceback" not in error
    assert not (out / "work" / "runs").exists() and not list(out.glob("records/*.json"))


def test_a_list_setting_may_be_given_as_a_toml_list():
    assert settings_of('--compare.methods=["yarn", "dynamic"]').methods == ["yarn", "dynamic"]
    assert settings_of("--compare.seeds=[1, 2, 3]").seeds == [1, 2, 3]
    assert settings_of("--compare.probes=[]").probes == []


def test_list_settings_take_comma_separated_items():
    settings = settings_of("--compare.methods=yarn,dynamic", "--compare.seeds=1,2", "--compare.probes=")
    assert (settings.methods, settings.seeds, settings.probes) == (["yarn", "dynamic"], [1, 2], [])


def test_an_encodings_settings_reach_the_encoding_and_its_variants_only():
    settings = settings_of("--config", str(ROOT / "configs" / "compare.toml"), "--preset", "quick",
                           '--compare.variants={t5-short = {position = "t5", position_args = {t5 = {num_buckets = 16}}},'
                           ' t5-own = {position = "t5", position_args = {t5 = {max_distance = 32}}}, '
                           'hybrid = {position = "rope", position_layers = ["rope", "t5"]}}')
    assert settings.model["position_args"] == {"t5": {"max_distance": 64}}  # the quick preset's
    assert settings.model_settings("t5") == {"position": "t5", "position_args": {"t5": {"max_distance": 64}}}
    assert settings.model_settings("t5-short")["position_args"] == {"t5": {"max_distance": 64, "num_buckets": 16}}
    assert settings.model_settings("t5-own")["position_args"]["t5"]["max_distance"] == 32  # the variant's wins
    assert settings.model_settings("hybrid")["position_args"] == {"t5": {"max_distance": 64}}
    assert settings.model_settings("rope") == {"position": "rope"}


def test_snapshot_probes_need_snapshots_and_name_the_use_probe():
    with pytest.raises(ConfigError, match="snapshot_probes"):
        Settings(snapshot_probes=["use"])
    with pytest.raises(ConfigError, match="snapshot_probes"):
        Settings(snapshots=[0.5], snapshot_probes=["passkey"])
    assert Settings(snapshots=[0.5], snapshot_probes=["use"]).snapshot_probes == ["use"]


def test_the_probe_names_of_the_settings_are_the_probes_that_run():
    assert list(compare.PROBES) == list(compare.PROBE_NAMES)


def test_how_a_run_executes_never_makes_it_other_settings():
    """A run saved with the chunked loss set explicitly (the default before it followed the device), compiled or not,
    is the same comparison; a setting that changes what is trained is not."""
    saved = {"model": {"dim": 64}, "train": {"lr": 3e-3, "fused_loss": True, "compile": False}}
    assert comparable(saved) == comparable({"model": {"dim": 64}, "train": {"lr": 3e-3, "fused_loss": None,
                                                                          "compile": True}})
    assert comparable(saved) != comparable({"model": {"dim": 64}, "train": {"lr": 1e-3, "fused_loss": True}})


def test_only_the_use_probe_needs_its_windows_to_fit_in_the_held_out_text(compare_data, small_text_file, tmp_path):
    out = study_folder(tmp_path, compare_data)
    many = ("--compare.use_windows=100000", "--compare.lengths=1x,16x")
    compare.prepare(settings_of(*arguments(small_text_file, out, *many)), Context(out))  # no use probe: no check
    with pytest.raises(ConfigError, match="lower use_windows to"):
        compare.prepare(settings_of(*arguments(small_text_file, out, *many, "--compare.probes=use")), Context(out))
    with pytest.raises(ConfigError, match="lower use_windows to"):
        compare.prepare(settings_of(*arguments(small_text_file, out, *many, "--compare.snapshots=0.5",
                                               "--compare.snapshot_probes=use")), Context(out))


# -------------------------------------------------------------------------------------------------- cells

def test_the_cells_that_evaluate_the_most_models_come_first(compare_data, small_text_file, tmp_path):
    """rope and the hybrid (each the model and five methods) before learned (and clamp), then the rest in the
    configured order, so that no worker idles at the end."""
    out = study_folder(tmp_path, compare_data)
    settings = settings_of(*arguments(small_text_file, out, "--compare.encodings=none,alibi,learned,rope,irope",
                                      "--compare.methods=linear,ntk,dynamic,yarn,clamp,selfextend", "--model.n_layers=2",
                                      '--compare.variants={irope = {position = "rope", position_layers = ["rope", '
                                      '"none"]}}'))
    found = cells(settings, Context(out))
    assert [cell["name"] for cell in found] == ["rope-seed1", "irope-seed1", "learned-seed1", "none-seed1",
                                                "alibi-seed1"]
    methods = {cell["encoding"]: cell["methods"] for cell in found}
    assert methods["rope"] == ["linear", "ntk", "dynamic", "yarn", "selfextend"] and methods["learned"] == ["clamp"]
    assert methods["none"] == methods["alibi"] == []


def test_a_cell_holds_what_its_measurement_depends_on_and_not_where_it_runs(compare_data, small_text_file, tmp_path):
    """The data's digest and the run's settings are in the cell (its address); the trackers are in its local part."""
    out = study_folder(tmp_path, compare_data)
    argv = arguments(small_text_file, out, "--compare.encodings=rope")
    [cell] = cells(settings_of(*argv), Context(out))
    assert cell["data"]["digest"] == compare.data_digest(out / "work" / "data") and cell["run"]["train"]["seed"] == 1
    [tracked] = cells(settings_of(*argv, '--train.report_to=["jsonl", "tensorboard"]'), Context(out))
    assert tracked["local"]["train"] == {"report_to": ["jsonl", "tensorboard"], "tracker_group": "compare:cmp"}
    assert key(tracked) == key(cell)  # where its metrics go is not what it measures
    [other] = cells(settings_of(*argv, "--compare.eval_tokens=256"), Context(out))
    assert key(other) != key(cell)


# -------------------------------------------------------------------------------------------- one cell measured

def test_one_cell_trains_and_records_every_length_method_snapshot_and_the_shift_probe(compare_data, small_text_file,
                                                                                     tmp_path):
    """learned, the encoding with a table: no number past its table as trained (the error is recorded), every
    length under clamp; the model kept at half of training scored at the shortest and longest lengths only."""
    out = study_folder(tmp_path, compare_data)
    settings = settings_of(*arguments(small_text_file, out, "--compare.encodings=learned", "--compare.snapshots=0.5"))
    [cell] = cells(settings, Context(out))
    assert cell["methods"] == ["clamp"] and cell["snapshot_methods"] == ["clamp"]
    record = measure(cell, Context(out, threads=1))
    assert record["status"] == "trained" and record["training"]["tokens"] == 6 * 4 * 16
    evaluation = record["evaluation"]
    assert set(evaluation["nll"]) == {"none@16", "clamp@16", "clamp@32", "clamp@64"}
    assert "beyond the learned table" in evaluation["errors"]["none@64"]
    assert set(evaluation["penalty"]) == {"clamp@32", "clamp@64"}
    assert all(len(windows) >= 3 for windows in evaluation["penalty"].values())  # per window: intervals over windows
    assert "clamp@240" in evaluation["probe"] and "none@16" not in evaluation["probe"]  # no row past the table
    assert list(record["snapshots"]) == ["3"] and set(record["snapshots"]["3"]["nll"]) == {"none@16", "clamp@16",
                                                                                          "clamp@64"}
    assert (next((out / "work" / "runs").glob("learned-seed1-*")) / "snapshots" / "step-000003" / "model.safetensors").exists()
    assert json.loads(json.dumps(record))["evaluation"] == evaluation  # JSON as it is


def test_an_encodings_own_learning_rate_reaches_its_optimizer_groups_and_no_other(compare_data, small_text_file,
                                                                                   tmp_path):
    from model import Transformer
    from train.loop import build_optimizer

    out = study_folder(tmp_path, compare_data)
    settings = settings_of(*arguments(small_text_file, out, "--compare.encodings=alibi,rope", "--train.max_steps=4",
                                      "--train.warmup_steps=2", "--train.log_interval=1", "--train.eval_interval=4",
                                      "--compare.train_settings={alibi = {lr = 0.0125}}"))
    rates = {}
    for cell in cells(settings, Context(out)):
        config = run_config(cell, out)
        groups = build_optimizer(Transformer(config.model), config, torch.device("cpu")).param_groups
        assert len(groups) >= 2 and {group["lr"] for group in groups} == {config.train.lr}
        assert compare.train(config) == "trained"
        logged = [json.loads(line) for line in (Path(config.out.dir) / "metrics.jsonl").read_text().splitlines()]
        rates[cell["encoding"]] = max(record["lr"] for record in logged if "lr" in record)  # the peak, after warm-up
    assert rates["alibi"] == pytest.approx(0.0125)
    assert rates["rope"] == pytest.approx(settings.train["lr"])  # the shared rate, untouched


def test_a_run_saved_before_newer_model_settings_is_the_same_run(compare_data, small_text_file, tmp_path):
    """A trained run whose saved settings spell the encodings' settings as before model.position_args (flat keys) is
    recognised as this cell's run: skipped, not refused."""
    out = study_folder(tmp_path, compare_data)
    settings = settings_of(*arguments(small_text_file, out, "--compare.encodings=irope", "--model.n_layers=4",
                                      "--train.max_steps=2"))
    [cell] = cells(settings, Context(out))
    config = run_config(cell, out)
    assert config.model.position_layers == ["rope", "rope", "rope", "none"]
    assert compare.train(config) == "trained"
    state_path = Path(config.out.dir) / "trainer_state.json"
    state = json.loads(state_path.read_text())
    model = state["run_config"]["model"]
    assert model["position_args"] == {"rope": {"fraction": 1.0, "p": 1.0}}
    del model["position_args"]
    model.update(rope_fraction=1.0, rope_p=1.0, cope_positions=0)
    state_path.write_text(json.dumps(state))
    assert compare.train(config) == "skipped (already trained)"
    longer = run_config(cell, out)  # the same folder asked to train otherwise: refused, not resumed
    longer.train.lr = 1e-2
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        compare.train(longer)


def test_a_cell_on_other_data_than_declared_fails_with_the_fix(compare_data, small_text_file, tmp_path):
    out = study_folder(tmp_path, compare_data)
    [cell] = cells(settings_of(*arguments(small_text_file, out, "--compare.encodings=rope")), Context(out))
    with pytest.raises(ConfigError, match="holds other data than this cell was declared on"):
        measure({**cell, "data": {**cell["data"], "digest": "0" * 16}}, Context(out, threads=1))
    assert not (out / "work" / "runs").exists()


# -------------------------------------------------------------------------------------------- the engine's run

def test_a_failed_cell_is_reported_and_the_others_go_on(compare_data, small_text_file, tmp_path, monkeypatch,
                                                        capsys):
    real = compare.train

    def failing(config):
        if config.model.position == "t5":
            raise RuntimeError("simulated failure")
        return real(config)

    monkeypatch.setattr(compare, "train", failing)
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=t5,rope")) == 1
    assert "t5-seed1: FAILED: RuntimeError: simulated failure" in capsys.readouterr().out
    assert list(by_name(out)) == ["rope-seed1"]
    assert invocations(out)[-1]["failed"] == 1 and invocations(out)[-1]["measured"] == 1
    assert table_labels(out) == {"rope", "rope+yarn", "rope+dynamic"}
    report = (out / "report.md").read_text()
    assert "Not measured yet (1 cells): t5-seed1." in report and "| t5 | | | | | | | not run |" in report
    # a rerun measures only the cell that failed
    monkeypatch.setattr(compare, "train", real)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=t5,rope")) == 0
    assert invocations(out)[-1]["measured"] == 1 and sorted(by_name(out)) == ["rope-seed1", "t5-seed1"]
    assert "Not measured yet" not in (out / "report.md").read_text()


def test_a_rerun_in_which_every_cell_fails_keeps_the_previous_report(compare_data, small_text_file, tmp_path,
                                                                     monkeypatch, capsys):
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope")) == 0
    report = (out / "report.md").read_bytes()

    def failing(config):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(compare, "train", failing)
    capsys.readouterr()
    # other evaluation settings: new cells, whose training fails
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope",
                                                 "--compare.eval_tokens=256")) == 1
    assert (out / "report.md").read_bytes() == report
    assert "no cell has a record yet: no report" in capsys.readouterr().out


def test_nothing_good_is_overwritten_by_a_refused_or_changed_rerun(compare_data, small_text_file, tmp_path, capsys):
    """A typo is refused up front with exit 2 and one line; other model settings make other cells and leave the
    records and runs there byte-identical; compiling is how a run executes, not what it trains: a rerun that compiles
    makes new cells (compiling is part of the cell) and retrains nothing."""
    out = study_folder(tmp_path, compare_data)
    two = "--compare.encodings=rope,alibi"
    assert main("experiments.compare", arguments(small_text_file, out, two)) == 0
    first = load_records(STUDY, out).cells

    def snapshot() -> dict[Path, bytes]:
        return {path: path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file() and
                ("records" in path.parts or "runs" in path.parts) and path.suffix != ".lock"}

    before, report = snapshot(), (out / "report.md").read_bytes()
    capsys.readouterr()
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope,alibl")) == 2
    error = capsys.readouterr().err
    assert "compare.encodings / train_settings: unknown" in error and "Traceback" not in error
    assert len([line for line in error.splitlines() if line.startswith("error:")]) == 1
    assert snapshot() == before and (out / "report.md").read_bytes() == report
    main("experiments.compare", arguments(small_text_file, out, two, "--model.dim=48"))
    changed = load_records(STUDY, out).cells
    assert not {key(cell) for cell in changed} & {key(cell) for cell in first}  # other cells
    assert {path: data for path, data in snapshot().items() if path in before} == before
    assert main("experiments.compare", arguments(small_text_file, out, two, "--train.compile=true")) == 0
    weights = [path for path in before if path.name == "model.safetensors"]
    assert len(weights) == 2 and all(path.read_bytes() == before[path] for path in weights)
    assert {record["status"] for record in by_name(out).values()} == {"skipped (already trained)"}


def test_a_changed_setting_in_the_same_folder_gets_records_of_its_own(compare_data, small_text_file, tmp_path):
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope")) == 0
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope",
                                                 "--model.dim=48")) == 0
    assert len(stored(out)) == 2 and by_name(out)["rope-seed1"]["status"] == "trained"


def test_other_data_in_the_same_folder_is_not_scored_with_the_models_of_the_previous_data(
        compare_data, small_text_file, tmp_path):
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope")) == 0
    other = tmp_path / "other.txt"
    other.write_text(small_text_file.read_text()[::-1])
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=rope",
                                                 f"--compare.source={other}")) == 0
    assert len(stored(out)) == 2
    assert by_name(out)["rope-seed1"]["status"] == "trained"


def test_a_moved_study_folder_evaluates_new_cells_on_the_models_it_trained(compare_data, small_text_file, tmp_path):
    first = study_folder(tmp_path / "first", compare_data)
    assert main("experiments.compare", arguments(small_text_file, first, "--compare.encodings=rope")) == 0
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    assert main("experiments.compare", arguments(small_text_file, moved, "--compare.encodings=rope",
                                                 "--compare.eval_tokens=256")) == 0
    assert by_name(moved)["rope-seed1"]["status"] == "skipped (already trained)"


# ----------------------------------------------------------------------------------------------- whole comparisons

def test_compare_end_to_end_with_seeds_snapshots_and_a_rerun(compare_data, small_text_file, tmp_path, capsys):
    out = study_folder(tmp_path, compare_data)
    args = arguments(small_text_file, out, "--compare.seeds=1,2", "--compare.snapshots=0.5", EVERY)
    assert main("experiments.compare", args) == 0
    records = by_name(out)
    assert sorted(records) == sorted(f"{e}-seed{s}" for e in ENCODINGS for s in (1, 2))
    assert {record["status"] for record in records.values()} == {"trained"}
    assert table_labels(out) == set(ENCODINGS) | {"rope+yarn", "rope+dynamic", "learned+clamp"}
    table = (out / "table.md").read_text()
    assert "| learned | " in table.split("### Extrapolation penalty")[0]
    assert all("beyond the learned table" in records[f"learned-seed{s}"]["evaluation"]["errors"]["none@32"]
               for s in (1, 2))
    ppl = next(line for line in table.splitlines() if line.startswith("| rope | "))
    assert ppl.count("[") == 3  # two seeds: an interval at every length
    report = (out / "report.md").read_text()
    for section in ("## Setup", "### Perplexity", "### Extrapolation penalty", "### Position-shift probe",
                    "### Extrapolation against training tokens", "## What this shows", "within noise",
                    "Student's t interval over seeds", "Reproduce: `python -m experiments.compare"):
        assert section in report, section
    snapshots = report.split("### Extrapolation against training tokens")[1].split("###")[0]
    for label in [e if e != "learned" else "learned+clamp" for e in ENCODINGS]:
        assert len([line for line in snapshots.splitlines() if line.startswith(f"| {label} | ")]) == 2, label
    probe = report.split("### Position-shift probe")[1].split("###")[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in probe.splitlines() if line.startswith("| ")}
    assert "n/a" not in rows["sinusoidal"][0] + rows["learned+clamp"][-1]
    assert rows["learned"][1:] == ["n/a", "n/a", "n/a |"]  # no row past its table (offsets L, 3L, 15L)
    for name in ("plot.png", "penalty.png", "position_loss.png", "train_curves.png", "snapshots.png", "table.md"):
        assert (out / name).stat().st_size > 0
    assert (next((out / "work" / "runs").glob("t5-seed2-*")) / "snapshots" / "step-000003" / "model.safetensors").exists()
    # A rerun measures nothing: every cell has its record; the numbers are the same
    before = {path: path.read_bytes() for path in (out / "records").glob("*.json")}
    assert main("experiments.compare", args) == 0
    assert {path: path.read_bytes() for path in (out / "records").glob("*.json")} == before
    assert [log["measured"] for log in invocations(out)] == [2 * len(ENCODINGS), 0]
    assert (out / "table.md").read_text() == table
    assert "all 2 invocations on record" in (out / "report.md").read_text()


def test_use_against_the_tokens_trained_probes_every_kept_model(compare_data, small_text_file, tmp_path):
    """compare.snapshot_probes = ["use"]: the use probe on each kept model as on the final one, and the report's
    table and figure of use against the tokens trained (issue 75)."""
    out = study_folder(tmp_path, compare_data)
    args = arguments(small_text_file, out, "--compare.encodings=none,rope", "--compare.seeds=1,2",
                     "--compare.snapshots=0.5", "--compare.probes=use", "--compare.snapshot_probes=use",
                     "--compare.methods=yarn", "--compare.use_distances=0.5x,2x,max", "--compare.use_windows=3",
                     "--model.max_seq_len=32")
    assert main("experiments.compare", args) == 0
    for name, record in by_name(out).items():
        kept, final = record["snapshot_probes"]["3"]["use"]["results"], record["probes"]["use"]["results"]
        assert kept and [r["use"] for r in kept] != [r["use"] for r in final], name  # other weights
        assert [r["distances"] for r in kept] == [r["distances"] for r in final], name  # the same windows
    report = (out / "report.md").read_text()
    section = report[report.index("### Use against the tokens trained"):].split("\n### ")[0]
    for label in ("none", "rope", "rope+yarn"):
        rows = [line for line in section.splitlines() if line.startswith(f"| {label} |")]
        assert [row.split("|")[2].strip() for row in rows] == ["384", "768"], rows  # 3 and 6 steps of 4 x 32
        assert all(row.split("|")[3].strip() != "n/a" for row in rows), rows  # the positive control, within L
        # the longest length's penalty beside use: scored for the kept models as trained (snapshot_methods: clamp)
        assert all((row.split("|")[-2].strip() == "n/a") == (label == "rope+yarn") for row in rows), rows
    assert (out / "use_budget.png").stat().st_size > 0


def test_the_newer_encodings_and_named_variants_run_through_compare(compare_data, small_text_file, tmp_path):
    """compare.variants from configs/compare.toml (a hybrid and p-RoPE) next to kerple: trained with their own
    settings, evaluated, with the RoPE methods applied to the RoPE-based variants only."""
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=kerple,p-rope,irope",
                                                 "--model.n_layers=4")) == 0
    assert table_labels(out) == {"kerple", "p-rope", "p-rope+yarn", "p-rope+dynamic", "irope", "irope+yarn",
                                 "irope+dynamic"}
    state = json.loads((next((out / "work" / "runs").glob("irope-seed1-*")) / "trainer_state.json").read_text())
    assert state["run_config"]["model"]["position_layers"] == ["rope", "rope", "rope", "none"]
    assert state["run_config"]["model"]["position_args"] == {"rope": {"fraction": 1.0, "p": 1.0}}
    report = (out / "report.md").read_text()
    assert 'irope: {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"]}' in report
    assert 'p-rope: {"position": "rope", "position_args": {"rope": {"p": 0.75}}}' in report


# ------------------------------------------------------------------------------ whole comparisons, the slower ones

def evaluations(out: Path) -> dict[str, dict]:
    """cell name -> its record's evaluation without its timing."""
    return {name: {k: v for k, v in record["evaluation"].items() if k != "seconds"}
            for name, record in by_name(out).items()}


@pytest.mark.integration  # two comparisons of 2 cells, one of them in two worker processes: about 25 s
def test_results_do_not_depend_on_the_number_of_workers(compare_data, small_text_file, tmp_path):
    runs = {}
    for workers in (1, 2):
        out = study_folder(tmp_path / f"w{workers}", compare_data)
        assert main("experiments.compare", arguments(small_text_file, out, "--compare.encodings=alibi,rope",
                                                     "--compare.seeds=3", "--workers", str(workers))) == 0
        runs[workers] = out
    assert "2 local processes" in invocations(runs[2])[-1]["where"]
    for name in ("alibi-seed3", "rope-seed3"):
        weights = [(next((runs[w] / "work" / "runs").glob(f"{name}-*")) / "model.safetensors").read_bytes() for w in (1, 2)]
        assert weights[0] == weights[1]
    assert evaluations(runs[1]) == evaluations(runs[2])
    assert (runs[1] / "table.md").read_text() == (runs[2] / "table.md").read_text()
    assert (runs[2] / "work" / "logs" / "rope-seed3.log").read_text().count("final val_loss") == 1


@pytest.mark.integration  # SIGKILLed comparisons in subprocesses: about 40 s on 2 cores
def test_a_comparison_killed_at_random_moments_ends_as_an_uninterrupted_one(compare_data, small_text_file, tmp_path):
    """SIGKILL a small comparison (2 encodings x 2 seeds) at random moments (fractions of an uninterrupted run's
    time) three times, rerun it to the end: the numbers equal those of an uninterrupted run and the report has each
    row once."""
    extra = ["--compare.encodings=alibi,rope", "--compare.seeds=1,2", "--train.max_steps=12",
             "--train.eval_interval=2"]  # a checkpoint every 2 steps: kills land mid-run
    straight, killed = study_folder(tmp_path / "straight", compare_data), study_folder(tmp_path / "killed",
                                                                                       compare_data)
    started = time.perf_counter()
    uninterrupted = subprocess.run([sys.executable, "-m", "experiments.compare",
                                    *arguments(small_text_file, straight, *extra)], cwd=ROOT, capture_output=True,
                                   text=True)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-2000:]
    duration = time.perf_counter() - started  # kills land at random fractions of it, on any machine's speed
    command = [sys.executable, "-m", "experiments.compare", *arguments(small_text_file, killed, *extra)]
    rng = random.Random(7)
    kills = 0
    for _ in range(3):
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, 0.7) * duration)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    assert kills >= 2  # most attempts were cut short
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert evaluations(straight) == evaluations(killed)
    assert (straight / "table.md").read_text() == (killed / "table.md").read_text()
    report = (killed / "report.md").read_text()
    for label in ("alibi", "rope", "rope+yarn", "rope+dynamic"):
        rows = [line for line in report.splitlines() if line.startswith(f"| {label} |")]
        assert len(rows) == len([line for line in (straight / "report.md").read_text().splitlines()
                                 if line.startswith(f"| {label} |")]) >= 1, label


@pytest.mark.integration  # two processes on one comparison of 4 cells: about 20 s on 2 cores
def test_two_processes_share_one_comparison_and_train_each_model_once(compare_data, small_text_file, tmp_path):
    """A second comparison started in the same folder with the same settings takes the cells the first has not
    (each cell under its lock): every model is trained once, by one of them."""
    out = study_folder(tmp_path, compare_data)
    command = [sys.executable, "-m", "experiments.compare",
               *arguments(small_text_file, out, "--compare.encodings=alibi,rope", "--compare.seeds=1,2")]
    processes = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(2)]
    assert [process.wait(timeout=900) for process in processes] == [0, 0]
    logs = invocations(out)
    assert len(logs) == 2 and sum(log["measured"] for log in logs) == 4 and len(stored(out)) == 4
    assert {record["status"] for record in by_name(out).values()} == {"trained"}
    assert not list((out / "records").glob("*.lock"))


@pytest.mark.integration  # a comparison with every probe and a task, then a rerun: about 15 s on 2 cores
def test_probes_and_tasks_add_their_sections_and_are_kept(compare_data, small_text_file, tmp_path, monkeypatch):
    """compare.probes run on every trained model (a length a learned table cannot run is recorded, not fatal),
    compare.tasks trains the task suite per encoding and seed, the report gets their sections, and a rerun measures
    nothing again."""
    import matplotlib

    from eval import figures
    from eval.figures import colour, method_colour

    out = study_folder(tmp_path, compare_data)
    args = arguments(small_text_file, out, "--compare.encodings=learned,rope",
                     "--compare.probes=attention,induction,passkey,use", "--compare.probe_lengths=1x,16x",
                     "--compare.use_distances=2x,max", "--compare.use_windows=3", "--compare.probe_tokens=256",
                     "--compare.passkey_trials=2", "--compare.tasks=flipflop", "--compare.task_steps=3",
                     "--compare.seeds=1,2", "--compare.methods=clamp", "--compare.lengths=1x,2x")
    strokes: dict[str, set[str]] = {}  # each figure's line colours, by its path in OUT without the suffix
    save = figures.save

    def recording(figure, path, *rest, **options):
        strokes[Path(path).relative_to(out).with_suffix("").as_posix()] = {
            matplotlib.colors.to_hex(colour) for axis in figure.axes
            for colour in [line.get_color() for line in axis.get_lines()]
            + [edge for collection in axis.collections for edge in collection.get_edgecolor()]}
        return save(figure, path, *rest, **options)

    monkeypatch.setattr(figures, "save", recording)
    assert main("experiments.compare", args) == 0
    records = by_name(out)
    attention = records["rope-seed1"]["probes"]["attention"]
    # 16x = 256 positions, binned to 64 (4 positions each); the means within and beyond L are exact
    assert len(attention["16x"]["entropy"]["by_position"][0]) == 64 and attention["16x"]["far"]["beyond_L"]
    assert attention["16x"]["entropy"]["positions"][:2] == [1.5, 5.5]
    learned = records["learned-seed2"]["probes"]["attention"]
    assert "entropy" in learned["1x"] and "learned table" in learned["16x"]["error"]
    passkey = records["rope-seed2"]["probes"]["passkey"]
    assert "too short for the passkey template" in passkey["1x"]["error"]  # 16 tokens: recorded, not fatal
    assert [row["trials"] for row in passkey["16x"]] == [2, 2, 2] and all("low" in row for row in passkey["16x"])
    tasks = [records[f"task/flipflop/{e}-seed{s}"] for e in ("learned", "rope") for s in (1, 2)]
    assert [(task["steps"], task["reached"]) for task in tasks] == [(3, False)] * 4  # the cap
    assert all(set(task["rows"]) == {"1x", "2x", "4x", "8x"} for task in tasks)
    use = records["rope-seed1"]["probes"]["use"]["results"]
    # at the longest length (2x = 32 tokens) as trained and under the window control (clamp does not apply to rope)
    assert {(r["method"], r["length"]) for r in use} == {("none", 32), ("window", 32)}
    assert np.asarray(use[0]["use"]).shape == (3, 1)  # 3 windows x one distance (2L does not fit in 2L: max only)
    # per distance, the passages whose copies a document's end parts (counted on the text as prepared)
    assert [len(r["across_documents"]) for r in use] == [len(r["distances"]) for r in use]
    assert all(0 <= count <= r["passages"] for r in use for count in r["across_documents"])
    report = (out / "report.md").read_text()
    for heading in ("### Attention diagnostics", "### Induction probe", "### Passkey retrieval", "### Task: flipflop",
                    "### Use of the text past L, on the same weights"):
        assert heading in report
    assert "| rope+window |" in report and "Negative control (rope+window" in report
    assert "- Copies in different documents (a document's end between them" in report
    assert "| rope @ 16x |" in report and (out / "attention.png").stat().st_size > 0
    assert " | 3* / 3* |" in report and "until validation exact match at L reaches 0.95, at most 3 steps" in report
    pngs = sorted(out.glob("**/*.png"))
    assert len(pngs) >= 6 and not list(out.rglob("*.svg"))  # one file per figure
    for name in ("plot", "penalty", "train_curves", "attention", "tasks/flipflop/flipflop"):
        assert colour("rope") in strokes[name], name  # one colour per encoding in every figure
        # learned: no table at 16x (attention) and no penalty as trained (its clamp row is in its own panel)
        assert (colour("learned") in strokes[name]) == (name not in ("attention", "penalty")), name
    assert method_colour("clamp") in strokes["penalty"]  # learned under each method
    before = {path: path.read_bytes() for path in (out / "records").glob("*.json")}
    assert main("experiments.compare", args) == 0
    assert invocations(out)[-1]["measured"] == 0
    assert {path: path.read_bytes() for path in (out / "records").glob("*.json")} == before


@pytest.mark.integration  # two encodings x two seeds, their retrieval models and grids: about 25 s on 2 cores
def test_the_map_preset_draws_harm_against_use(compare_data, small_text_file, tmp_path):
    """The map preset at a micro scale: text and retrieval tasks for two encodings and two seeds, the window control
    on both, and the report's extrapolation map (figure, table, readings)."""
    out = study_folder(tmp_path, compare_data)
    overrides = [o for o in MICRO if not o.startswith(("--compare.methods", "--compare.seeds", "--compare.probes"))]
    assert main("experiments.compare", [
        "--config", str(ROOT / "configs" / "compare.toml"), "--preset", "map", "--out", str(out),
        f"--compare.source={small_text_file}", "--compare.val_fraction=0.3", *overrides,
        "--compare.encodings=alibi,rope", "--compare.seeds=1,2", "--compare.tasks=mqar,niah_multikey",
        "--compare.task_steps=4", "--compare.task_cycle=2", "--compare.task_count=8", "--compare.use_windows=3",
        "--workers", "1", "--threads", "1"]) == 0
    assert {"alibi", "alibi+window", "rope", "rope+yarn", "rope+window", "rope+yarn+window"} <= table_labels(out)
    records = by_name(out)
    grid = records["task/mqar/rope-seed1"]["grids"]
    assert set(grid) == {"none", "yarn"}  # the window control is scored beside each
    report = (out / "report.md").read_text()
    assert "### The extrapolation map: harm against use" in report and "![the extrapolation map](map.png)" in report
    section = report.split("### The extrapolation map: harm against use")[1].split("\n### ")[0]
    points = {line.split(" | ")[0].strip("| ") for line in section.splitlines()
              if line.startswith("| ") and not line.startswith("| variant")}
    assert points == {"alibi", "rope", "rope+yarn"}  # the window control is no point of its own
    assert "mqar exact match: model - control (paired)" in section and "niah_multikey exact match: model" in section
    assert "### Task: mqar" in report and "### Task: niah_multikey" in report and "answer distance" in report
    assert (out / "map.png").stat().st_size > 0 and not (out / "map.svg").exists()  # one file per figure


@pytest.mark.integration  # a comparison of 3 designs x 2 seeds under 2 methods
def test_the_frontier2_preset_runs_and_checks_its_claims(compare_data, small_text_file, tmp_path):
    """The frontier2 preset at a micro scale: its designs train and evaluate beyond L, the resonance method composes
    with a Resonance-trained model, and the report checks the papers' claims (PoPE against RoPE and RoPE + YaRN,
    Resonance YaRN against YaRN)."""
    out = study_folder(tmp_path, compare_data)
    assert main("experiments.compare", [
        "--config", str(ROOT / "configs" / "compare.toml"), "--preset", "frontier2", "--out", str(out),
        f"--compare.source={small_text_file}", "--compare.val_fraction=0.3", *MICRO,
        "--compare.encodings=rope,pope,rope-resonance", "--compare.seeds=1,2", "--compare.methods=yarn,resonance",
        "--workers", "1", "--threads", "1"]) == 0
    saved = json.loads((next((out / "work" / "runs").glob("rope-resonance-seed1-*")) / "config.json").read_text())
    assert saved["rope_scaling"]["rope_type"] == "resonance" and saved["rope_scaling"]["factor"] == 1.0
    labels = table_labels(out)
    assert {"pope", "rope+resonance", "rope-resonance+resonance", "rope-resonance+yarn"} <= labels
    assert "pope+yarn" not in labels  # a RoPE scaling applies to RoPE models only
    report = (out / "report.md").read_text()
    assert "PoPE extrapolates beyond L better than RoPE under YaRN, zero-shot (Gopalakrishnan et al. 2025)" in report
    assert "Resonance YaRN extrapolates beyond L better than YaRN (Wang et al. 2024)" in report
