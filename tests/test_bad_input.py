"""Bad input through the command-line entry points: exit code 2, one line on stderr naming the file or field
and the fix, and a good run already in place is left byte-for-byte as it was."""
import json
import shutil

import numpy as np
import pytest

from data.batches import TokenFile
from data.prepare import token_dtype
from errors import ConfigError
from scripts.generate import main as generate
from train.pretrain import main as pretrain
from train.sft import main as sft

SHAPE = ["--model.vocab_size=512", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1",
         "--model.max_seq_len=16", "--train.batch_size=2", "--train.eval_batches=1", "--train.max_steps=2"]


@pytest.fixture(scope="module")
def good_run(prepared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("good") / "run"
    assert pretrain([*SHAPE, f"--data.dir={prepared_data}", f"--out.dir={out}"]) == 0
    return out


def snapshot(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def one_line_error(capsys):
    """The one error line (progress bars of `datasets` may precede it; a traceback may not)."""
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and not any("Traceback" in line for line in lines), lines
    return errors[0]


PRETRAIN_CASES = {
    "tokenizer larger than the model": (["--model.vocab_size=256"], "has 512 tokens but model.vocab_size is 256; set --model.vocab_size=512"),
    "unknown encoding": (["--model.position=rotary"], "model.position: unknown encoding 'rotary'; valid names are"),
    "unknown scaling": (['--model.rope_scaling={rope_type="yarnn", factor=4.0}'], "yarnn"),
    "scaling factor below 1": (['--model.rope_scaling={rope_type="linear", factor=0.5}'], "factor"),
    "length beyond a learned table": (["--model.position=learned", "--model.position_args.learned.max_positions=8"],
                                      "beyond the learned table of 8 positions"),
    "an encoding setting spelled the old way": (["--model.position=t5", "--model.t5_max_distance=8"],
                                                "model.t5_max_distance is now model.position_args.t5.max_distance"),
    "settings of an encoding the model does not use": (["--model.position_args.t5.max_distance=8"],
                                                       "settings for ['t5'], which this model does not use"),
    "resume with another shape": (["--model.dim=64", "--resume"], "cannot change in a run: model.dim"),
    "out dir holds a run": ([], "already holds a run; pass --resume"),
}


@pytest.mark.parametrize("case", sorted(PRETRAIN_CASES))
def test_pretrain_refuses_bad_input_and_keeps_the_good_run(case, good_run, prepared_data, capsys):
    extra, message = PRETRAIN_CASES[case]
    before = snapshot(good_run)
    assert pretrain([*SHAPE, f"--data.dir={prepared_data}", f"--out.dir={good_run}", *extra]) == 2
    assert message in one_line_error(capsys)
    assert snapshot(good_run) == before


def test_missing_data_folder_names_the_fix(good_run, tmp_path, capsys):
    assert pretrain([*SHAPE, f"--data.dir={tmp_path / 'nowhere'}", f"--out.dir={tmp_path / 'out'}"]) == 2
    assert "is not a prepared data folder; create it with `python -m data.prepare" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["missing weights", "truncated weights", "corrupted header", "config mismatch"])
def test_broken_checkpoints_are_refused_by_generate_and_by_init(damage, good_run, prepared_data, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(good_run, broken)
    weights = broken / "model.safetensors"
    if damage == "missing weights":
        weights.unlink()
    elif damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "corrupted header":
        weights.write_bytes(b"\xff" * 16 + weights.read_bytes()[16:])
    else:
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, "n_layers": 2}))
    assert generate(["--checkpoint", str(broken), "--prompt", "def", "--max-new-tokens", "2"]) == 2
    error = one_line_error(capsys)
    assert str(broken) in error or "model.safetensors" in error
    out = tmp_path / "sft"
    assert sft([f"--checkpoint={broken}", f"--out.dir={out}", "--train.max_steps=1"]) == 2
    one_line_error(capsys)
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize("record, message", [
    ({"conversations": [{"role": "robot", "content": "hi"}]}, "role"),
    ({"conversations": [{"role": "user", "content": ""}]}, "empty"),
    ({"messages": []}, "conversations"),
])
def test_sft_refuses_malformed_conversations(record, message, good_run, tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}, record]))
    out = tmp_path / "sft"
    assert sft([f"--checkpoint={good_run}", f"--data.source={data}", f"--out.dir={out}", "--train.max_steps=1"]) == 2
    error = one_line_error(capsys)
    assert message in error
    assert not (out / "model.safetensors").exists()


def test_vocabularies_beyond_uint16_use_uint32_token_files(tmp_path):
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    ids = np.array([0, 65_535, 65_536, 200_000, 7], dtype=np.uint32)
    ids.tofile(tmp_path / "train.bin")
    inputs, targets = TokenFile(tmp_path / "train.bin", "uint32").windows(np.array([0]), 3)
    assert inputs.tolist() == [[0, 65_535, 65_536]] and targets.tolist() == [[65_535, 65_536, 200_000]]


def test_a_bug_inside_a_command_keeps_its_traceback_and_a_user_error_is_one_line(good_run, tmp_path, capsys,
                                                                               monkeypatch):
    """Only a UserError becomes "error: ..." and exit 2; any other exception (here a simulated bug: a KeyError
    inside the evaluation) propagates, so `python -m` prints its traceback and exits 1."""
    import subprocess
    import sys

    import eval.perplexity as perplexity
    from tests.conftest import ROOT

    args = ["--checkpoint", str(good_run), "--data", str(good_run.parent / "missing"), "--length", "8"]
    assert perplexity.main(args) == 2
    assert "missing" in one_line_error(capsys)

    def bug(*_args, **_kwargs):
        return {}["run_config"]

    monkeypatch.setattr(perplexity, "evaluate_stream", bug)
    data = json.loads((good_run / "trainer_state.json").read_text())["run_config"]["data"]["dir"]
    with pytest.raises(KeyError, match="run_config"):
        perplexity.main(["--checkpoint", str(good_run), "--data", data, "--length", "8"])
    script = ("import sys, eval.perplexity as p\n"
              "p.evaluate_stream = lambda *a, **k: {}['run_config']\n"
              f"sys.exit(p.main(['--checkpoint', {str(good_run)!r}, '--data', {data!r}, '--length', '8']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError: 'run_config'" in done.stderr
    assert "error: " not in done.stderr


def test_extrapolation_on_a_checkpoint_that_records_no_data_asks_for_data(good_run, tmp_path, capsys):
    """An imported checkpoint's trainer state has no run config: a clear error naming --data, not a KeyError."""
    from eval.extrapolation import main as extrapolation

    imported = tmp_path / "imported"
    shutil.copytree(good_run, imported)
    state = json.loads((imported / "trainer_state.json").read_text())
    del state["run_config"], state["data_folder"]
    (imported / "trainer_state.json").write_text(json.dumps(state))
    assert extrapolation(["--checkpoint", str(imported), "--out", str(tmp_path / "out")]) == 2
    assert "does not record the data it was trained on" in one_line_error(capsys)


def test_a_per_layer_list_given_one_value_is_refused_with_the_list_to_give():
    from model.config import ModelConfig
    from model.fields import check_field_types

    config = ModelConfig(vocab_size=97, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, max_seq_len=16)
    config.qk_norm = True
    with pytest.raises(ConfigError, match=r"model\.qk_norm: expected list, got bool True; give a list, e\.g\. \[true\]"):
        check_field_types(config, "model")
