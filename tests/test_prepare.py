"""data.prepare and the text sources."""
import json
import sys
import time

import numpy as np
import pytest

from data.prepare import main as prepare_main
from data.prepare import prepare
from data.sources import load_source
from data.tokenizer import load_tokenizer
from errors import SourceError


def test_prepare_small_local_file(prepared_data, small_text_file):
    meta = json.loads((prepared_data / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 512
    documents = small_text_file.read_text().count("<|endoftext|>") + 1
    assert meta["train_documents"] + meta["val_documents"] == documents
    assert meta["val_documents"] >= 1 and meta["train_documents"] >= 1
    assert len(meta["val_names"]) == meta["val_documents"]
    assert all(name.startswith("code.txt#") for name in meta["val_names"])  # file name and document index
    tokenizer = load_tokenizer(prepared_data)
    for split in ("train", "val"):
        tokens = np.fromfile(prepared_data / f"{split}.bin", dtype=np.uint16)
        assert len(tokens) == meta[f"{split}_tokens"]
        # Every document ends with <|endoftext|>.
        assert tokens[-1] == meta["eos_id"] == 0
        assert int((tokens == 0).sum()) == meta[f"{split}_documents"]
        assert tokens.max() < 512
    # The text decodes back to the source documents.
    train_text = tokenizer.decode(np.fromfile(prepared_data / "train.bin", dtype=np.uint16).tolist())
    assert "def " in train_text and train_text.count("<|endoftext|>") == meta["train_documents"]


def test_split_is_deterministic_and_reuses_tokenizer(prepared_data, small_text_file, tmp_path):
    out = tmp_path / "again"
    meta = prepare(str(small_text_file), out, tokenizer_path=str(prepared_data), val_fraction=0.2, num_proc=1)
    assert meta["tokenizer"] == str(prepared_data)
    for split in ("train", "val"):
        assert (out / f"{split}.bin").read_bytes() == (prepared_data / f"{split}.bin").read_bytes()


def test_jsonl_and_parquet_sources(tmp_path):
    rows = [{"text": f"document number {i}", "other": i} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    source = load_source(str(tmp_path / "a.jsonl"))
    assert source.dataset["text"] == [row["text"] for row in rows]
    source.dataset.to_parquet(str(tmp_path / "b.parquet"))
    assert load_source(str(tmp_path / "b.parquet")).dataset["text"] == source.dataset["text"]
    (tmp_path / "c.txt").write_text("plain text document")
    folder = load_source(str(tmp_path))  # a folder mixes file types
    assert len(folder.dataset) == 11
    assert "c.txt" in folder.dataset["name"]


def test_jsonl_without_text_field_is_a_clear_error(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(SourceError, match="no 'text' field"):
        load_source(str(tmp_path / "c.jsonl"))


def test_single_document_is_split_by_lines(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    out = tmp_path / "prepared"
    meta = prepare(str(path), out, vocab_size=300, val_fraction=0.1, num_proc=1)
    assert meta["train_documents"] == meta["val_documents"] == 1
    assert 0.05 < meta["val_bytes"] / (meta["train_bytes"] + meta["val_bytes"]) < 0.15


def test_stdlib_source_records_python_version_and_file_count():
    source = load_source("stdlib")
    assert source.meta["python_version"] == sys.version.split()[0]
    assert source.meta["file_count"] > 300
    names = source.dataset["name"]
    assert not any("/test/" in name or name.startswith("test/") for name in names)
    assert any(name.startswith("pydoc_data/topics/") for name in names)


def test_hub_source_offline_fails_fast_with_alternatives(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(SourceError, match="Offline alternatives: --data stdlib"):
        load_source("tinystories")
    assert time.perf_counter() - started < 5


def test_unknown_source_cli_error(tmp_path, capsys):
    assert prepare_main(["--data", "no_such_source", "--out", str(tmp_path / "x")]) == 2
    assert "unknown source 'no_such_source'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_prepared_folder_is_refused_without_overwrite_and_replaced_with_a_note(small_text_file, tmp_path, capsys):
    """The rule training follows for a run folder: an --out holding prepared data (or any file data.prepare writes)
    is refused, one line naming what it holds; --overwrite replaces it and says what it replaced."""
    out = tmp_path / "data"
    argv = ["--data", str(small_text_file), "--out", str(out), "--vocab-size", "300", "--num-proc", "1"]
    assert prepare_main(argv) == 0
    assert "replaced" not in capsys.readouterr().out
    before = prepared_folder_bytes(out)
    assert prepare_main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith(f"error: {out} already holds prepared data of ")
    assert error.endswith("pass --overwrite to replace it, or choose another --out")
    assert prepared_folder_bytes(out) == before
    assert prepare_main([*argv[:5], "400", "--num-proc", "1", "--overwrite"]) == 0
    assert f"replaced what {out} held: prepared data of " in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["vocab_size"] == 400
    run = tmp_path / "run"  # a folder holding another command's files it would replace (a checkpoint's tokenizer)
    run.mkdir()
    (run / "tokenizer.json").write_text("{}")
    assert prepare_main(["--data", str(small_text_file), "--out", str(run)]) == 2
    assert "already holds tokenizer.json" in capsys.readouterr().err


def prepared_folder_bytes(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.mark.parametrize("case", ["missing", "empty_txt", "empty_jsonl", "latin1_txt", "latin1_jsonl", "split_char"])
def test_bad_data_files_fail_clearly_and_keep_the_good_output(case, prepared_data, tmp_path, capsys):
    """Each bad file: exit 2, a one-line error naming the file (and the byte for non-UTF-8), and the good
    prepared folder given as --out (with --overwrite) is left byte-for-byte as it was."""
    good = {path.name: path.read_bytes() for path in prepared_data.iterdir()}
    text = "def f(x):\n    return x\n" * 50
    files = {
        "missing": ("absent.txt", None),
        "empty_txt": ("empty.txt", b""),
        "empty_jsonl": ("empty.jsonl", b""),
        "latin1_txt": ("latin1.txt", (text + "caf\u00e9\n").encode("latin-1")),
        "latin1_jsonl": ("latin1.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n'),
        # a 3-byte character straddling the 1 MiB read chunks must not be mistaken for bad bytes; a bad byte after it must be found
        "split_char": ("split.txt", b"a" * ((1 << 20) - 1) + "\u20ac".encode() + b"\n\xff"),
    }
    name, content = files[case]
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert prepare_main(["--data", str(path), "--out", str(prepared_data), "--vocab-size", "300", "--overwrite"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and str(path) in error
    expected = {
        "missing": "no such file or folder",
        "empty_txt": "empty file",
        "empty_jsonl": "empty file",
        "latin1_txt": f"not UTF-8 at byte {len(text) + 3} (line 101",
        "latin1_jsonl": "not UTF-8 at byte 28 (line 2",  # 15 bytes of line 1 + 13 before the é
        "split_char": f"not UTF-8 at byte {(1 << 20) + 3} (line 2",
    }[case]
    assert expected in error, error
    if "latin1" in case or case == "split_char":
        assert "--errors replace" in error
    assert {p.name: p.read_bytes() for p in prepared_data.iterdir()} == good


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_errors_replace_reads_undecodable_bytes_as_replacement_characters(suffix, tmp_path):
    body = "def f(x):\n    return x\n" * 50 + "caf\u00e9 au lait\n"
    content = body.encode("latin-1") if suffix == ".txt" else (json.dumps({"text": body}, ensure_ascii=False)
                                                               .encode("latin-1") + b"\n")
    path = tmp_path / f"latin1{suffix}"
    path.write_bytes(content)
    with pytest.raises(SourceError, match="not UTF-8"):
        load_source(str(path))
    texts = load_source(str(path), errors="replace").dataset["text"]
    assert any("caf\ufffd au lait" in text for text in texts)
    assert prepare_main(["--data", str(path), "--out", str(tmp_path / "out"), "--vocab-size", "300",
                         "--errors", "replace", "--val-fraction", "0.5"]) == 0


def test_tokenizing_in_several_processes_keeps_the_process_environment(tmp_path, monkeypatch):
    """datasets' map(num_proc>1) rebinds os.environ to a copy; encode_documents restores the real mapping, so an
    environment variable set and removed around it (here by monkeypatch) does not leak into later code."""
    import os

    import datasets

    from data.prepare import encode_documents
    from data.tokenizer import ENDOFTEXT, train_bpe

    environ = os.environ
    texts = [f"document {i} with some words in it" for i in range(8)]
    tokenizer = train_bpe(iter(texts), 300)
    eos = tokenizer.token_to_id(ENDOFTEXT)
    monkeypatch.setenv("PELAB_TEST_MARKER", "set")
    encoded = encode_documents(datasets.Dataset.from_dict({"text": texts}), tokenizer, eos, 2, "test")
    assert len(encoded) == 8 and encoded[0]["ids"][-1] == eos
    assert os.environ is environ and os.environ["PELAB_TEST_MARKER"] == "set"
    monkeypatch.delenv("PELAB_TEST_MARKER")
    assert "PELAB_TEST_MARKER" not in os.environ
