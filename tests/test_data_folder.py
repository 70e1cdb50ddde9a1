"""A checkpoint finds its training data folder from any working directory (model/checkpoint.py): the absolute
path recorded at save time, then the path relative to the checkpoint folder, then the run's data.dir as given."""
import json
import shutil

import pytest

from errors import DataError
from model.checkpoint import DATA_FOLDER, data_folder_record, training_data_dir
from tests.conftest import train_micro_run


@pytest.fixture()
def relative_run(prepared_data, tmp_path, monkeypatch):
    """A checkpoint trained from tmp/first with data.dir and out.dir relative to it (as `make demo` does)."""
    first = tmp_path / "first"
    shutil.copytree(prepared_data, first / "runs" / "data" / "code")
    monkeypatch.chdir(first)
    train_micro_run("runs/data/code", "runs/demo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return first


def test_the_record_holds_an_absolute_path_and_one_relative_to_the_checkpoint(relative_run):
    state = json.loads((relative_run / "runs" / "demo" / "trainer_state.json").read_text())
    assert state["run_config"]["data"]["dir"] == "runs/data/code"  # as given
    assert state[DATA_FOLDER] == {"path": str((relative_run / "runs" / "data" / "code").resolve()),
                                  "relative_to_checkpoint": "../data/code"}
    assert data_folder_record("x/data", "x/runs/snapshots/step-000002")["relative_to_checkpoint"] == "../../../data"


def test_an_evaluation_from_another_directory_finds_the_data_folder(relative_run, tmp_path, capsys):
    from eval.attention_diagnostics import main as attention_main

    checkpoint = relative_run / "runs" / "demo"
    assert training_data_dir(checkpoint) == str((relative_run / "runs" / "data" / "code").resolve())
    assert attention_main(["--checkpoint", str(checkpoint), "--lengths", "1x,8x", "--tokens", "256",
                           "--out", str(tmp_path / "attention")]) == 0
    assert "val.bin: the documents data.prepare held out" in capsys.readouterr().out


def test_a_run_folder_moved_with_its_data_is_found_relative_to_the_checkpoint(relative_run, tmp_path):
    moved = tmp_path / "moved"
    shutil.move(relative_run / "runs", moved)
    assert training_data_dir(moved / "demo") == str(moved / "demo" / ".." / "data" / "code")


def test_train_extend_from_another_directory_reads_the_checkpoints_data(relative_run, tmp_path):
    from train.extend import main as extend_main

    out = tmp_path / "extended"
    assert extend_main(["--checkpoint", str(relative_run / "runs" / "demo"), "--rope-scaling", "yarn",
                        "--rope-factor", "2", "--train.max_steps=1", "--train.batch_size=2",
                        "--train.eval_batches=1", "--out", str(out)]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state[DATA_FOLDER]["path"] == str((relative_run / "runs" / "data" / "code").resolve())


def test_an_old_checkpoint_works_from_its_own_directory_and_names_what_it_tried_elsewhere(relative_run,
                                                                                         monkeypatch, capsys):
    """A checkpoint saved before the record holds only data.dir as given: found from the directory it was
    trained from; elsewhere a one-line error lists the paths tried and the --data flag."""
    from eval.extrapolation import main as extrapolation_main

    checkpoint = relative_run / "runs" / "demo"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    del state[DATA_FOLDER]
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(DataError) as error:
        training_data_dir(checkpoint)
    message = str(error.value)
    assert "runs/data/code (the run's data.dir, from the current directory" in message and "--data" in message
    assert extrapolation_main(["--checkpoint", str(checkpoint), "--lengths", "1x", "--tokens", "64",
                               "--out", "x"]) == 2
    printed = capsys.readouterr().err.strip()
    assert printed.startswith("error: ") and "not found here; tried" in printed and "\n" not in printed
    monkeypatch.chdir(relative_run)
    assert training_data_dir(checkpoint) == "runs/data/code"
