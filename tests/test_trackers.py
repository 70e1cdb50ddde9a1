"""train.report_to: TensorBoard and wandb (offline) get the same numbers as metrics.jsonl, read back with
TensorBoard's own reader and from wandb's run file; a resumed run continues the same tracker run."""
import json
import struct
import time

import pytest

from train.pretrain import main as pretrain

MICRO = ["--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
         "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1",
         "--train.log_interval=1", "--train.eval_interval=2", "--train.warmup_steps=1"]


def jsonl(run, key):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in records if key in r}


def tensorboard_scalars(run, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run / "tensorboard"))
    accumulator.Reload()
    return {event.step: event.value for event in accumulator.Scalars(tag)}


def test_tensorboard_gets_the_jsonl_numbers_and_a_resumed_run_appends(prepared_data, tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    args = [f"--data.dir={prepared_data}", f"--out.dir={run}", *MICRO, '--train.report_to=["jsonl", "tensorboard"]']
    assert pretrain([*args, "--train.max_steps=2"]) == 0
    assert pretrain([*args, "--train.max_steps=4", "--resume"]) == 0
    losses, val = jsonl(run, "loss"), jsonl(run, "val_loss")
    assert sorted(losses) == [1, 2, 3, 4] and sorted(val) == [0, 2, 4]
    assert tensorboard_scalars(run, "train/loss") == pytest.approx(losses, rel=1e-6)
    assert tensorboard_scalars(run, "val/loss") == pytest.approx(val, rel=1e-6)
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one run folder, two sessions


def wandb_history(run_file):
    """The history rows of a wandb run file: a LevelDB-style log (7-byte file header; 32 KiB blocks of records
    with a 7-byte header: crc32, length, type FULL/FIRST/MIDDLE/LAST) of wandb's Record protobufs."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, rows, run_id = run_file.read_bytes(), 7, b"", {}, None
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        _, length, kind = struct.unpack("<IHB", data[position : position + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:
            position += left
            continue
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "run":
                run_id = record.run.run_id
            elif record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                rows[int(items["_step"])] = items
    return run_id, rows


def test_wandb_offline_gets_the_jsonl_numbers_and_a_resumed_run_keeps_its_id(prepared_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from google.protobuf.message import DecodeError

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    args = [f"--data.dir={prepared_data}", f"--out.dir={run}", *MICRO, '--train.report_to=["wandb"]',
            "--train.tracker_group=test"]
    assert pretrain([*args, "--train.max_steps=2"]) == 0
    first_id = json.loads((run / "trainer_state.json").read_text())["trackers"]["wandb"]
    assert pretrain([*args, "--train.max_steps=4", "--resume"]) == 0
    assert json.loads((run / "trainer_state.json").read_text())["trackers"]["wandb"] == first_id
    losses, val = jsonl(run, "loss"), jsonl(run, "val_loss")
    # wandb's service process writes these files; once (under the whole suite's load) one lacked its run record
    # when read at once, so give the writer up to 30 s: until both files hold their run record and every logged step.
    for _ in range(60):
        files = sorted(run.glob("wandb/offline-run-*/run-*.wandb"))
        try:
            parsed = [wandb_history(path) for path in files]
        except DecodeError:  # a record still being written
            parsed = []
        history = {step: row for _, rows in parsed for step, row in rows.items()}
        if len(parsed) == 2 and all(run_id is not None for run_id, _ in parsed) and set(losses) <= set(history):
            break
        time.sleep(0.5)
    assert len(files) == len(parsed) == 2, files
    for path, (run_id, _) in zip(files, parsed):
        assert run_id == first_id, (path, path.stat().st_size)  # the resumed session logs into the same run
    assert {step: row["train/loss"] for step, row in history.items() if "train/loss" in row} == \
        pytest.approx(losses, rel=1e-6)
    assert {step: row["val/loss"] for step, row in history.items() if "val/loss" in row} == pytest.approx(val, rel=1e-6)


def test_a_missing_tracker_package_or_an_unknown_tracker_is_one_line(prepared_data, tmp_path, monkeypatch, capsys):
    import train.trackers

    monkeypatch.setitem(train.trackers.PACKAGES, "tensorboard", "no_such_package_for_pelab")
    run = tmp_path / "run"
    base = [f"--data.dir={prepared_data}", f"--out.dir={run}", *MICRO, "--train.max_steps=1"]
    assert pretrain([*base, '--train.report_to=["tensorboard"]']) == 2
    error = capsys.readouterr().err
    assert "pip install no_such_package_for_pelab" in error and "Traceback" not in error
    assert pretrain([*base, '--train.report_to=["mlflow"]']) == 2
    assert "valid trackers are ['jsonl', 'tensorboard', 'wandb']" in capsys.readouterr().err
    assert not (run / "model.safetensors").exists()


def test_a_comparison_logs_each_variant_as_a_run_of_one_group_and_its_tables(small_text_file, tmp_path):
    pytest.importorskip("tensorboard")
    from experiments.engine import main
    from tests.test_compare import arguments

    out = tmp_path / "cmp"
    args = arguments(small_text_file, out, "--compare.encodings=alibi,rope", "--compare.methods=yarn",
                     "--compare.lengths=1x,2x")
    assert main("experiments.compare", [*args, '--train.report_to=["jsonl", "tensorboard"]']) == 0
    from experiments.compare import STUDY, run_folder
    from experiments.engine import load_records

    cells = {cell["name"]: cell for cell in load_records(STUDY, out).cells}
    for encoding in ("alibi", "rope"):
        run = run_folder(out / "work", cells[f"{encoding}-seed1"])
        assert json.loads((run / "trainer_state.json").read_text())["run_config"]["train"]["tracker_group"] == \
            "compare:cmp"
        assert tensorboard_scalars(run, "train/loss") == pytest.approx(jsonl(run, "loss"), rel=1e-6)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    summary.Reload()
    assert "summary/rope+yarn/ppl_2x" in summary.Tags()["scalars"] and "report/text_summary" in summary.Tags()["tensors"]
    # where the metrics go is not what a cell measures: a rerun without the tracker finds every record
    records = {path: path.read_bytes() for path in (out / "records").glob("*.json")}
    assert main("experiments.compare", args) == 0
    last = json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])
    assert (last["measured"], last["cells"]) == (0, 2)
    assert {path: path.read_bytes() for path in (out / "records").glob("*.json")} == records
