"""Bad input through the command-line entry points: exit code 2, one line on stderr naming the file or field
and the fix, and a good run already in place is left byte-for-byte as it was."""
import json
import shutil

import numpy as np
import pytest

from data.batches import TokenFile
from data.prepare import token_dtype
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
    "length beyond a learned table": (["--model.position=learned", "--model.learned_max_positions=8"],
                                      "beyond the learned table of 8 positions"),
    "resume with another shape": (["--model.dim=64", "--resume"], "model config differs from the run"),
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
    assert sft([f"--init={broken}", f"--out.dir={out}", "--train.max_steps=1"]) == 2
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
    assert sft([f"--init={good_run}", f"--data.source={data}", f"--out.dir={out}", "--train.max_steps=1"]) == 2
    error = one_line_error(capsys)
    assert message in error
    assert not (out / "model.safetensors").exists()


def test_vocabularies_beyond_uint16_use_uint32_token_files(tmp_path):
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    ids = np.array([0, 65_535, 65_536, 200_000, 7], dtype=np.uint32)
    ids.tofile(tmp_path / "train.bin")
    inputs, targets = TokenFile(tmp_path / "train.bin", "uint32").windows(np.array([0]), 3)
    assert inputs.tolist() == [[0, 65_535, 65_536]] and targets.tolist() == [[65_535, 65_536, 200_000]]
