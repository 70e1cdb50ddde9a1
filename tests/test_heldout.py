"""What an evaluation reads: only held-out documents of a raw source, and hub sources with their own splits
(tested offline against small local files laid out like the hub repositories)."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.prepare import main as prepare_main
from data.sources import load_source
from data.tokenizer import load_tokenizer
from errors import DataError, SourceError
from eval.heldout import (
    HOLDS,
    INSIDE,
    OTHER,
    SAME,
    checkpoint_eval_tokens,
    load_eval_tokens,
    training_source_relation,
    training_val_fraction,
)
from train.pretrain import main as pretrain_main


@pytest.fixture(scope="module")
def marked_corpus(tmp_path_factory):
    """40 documents, each made of words that name it (doc17 ...), so any scored text tells its document."""
    folder = tmp_path_factory.mktemp("marked")
    for index in range(40):
        words = " ".join(f"doc{index} says word{i % 7}." for i in range(60))
        (folder / f"d{index:02d}.txt").write_text(words + "\n")
    return folder


@pytest.fixture(scope="module")
def marked_checkpoint(marked_corpus, tmp_path_factory):
    data = tmp_path_factory.mktemp("marked_data") / "prepared"
    assert prepare_main(["--data", str(marked_corpus), "--out", str(data), "--vocab-size", "400",
                         "--val-fraction", "0.25", "--num-proc", "1"]) == 0
    run = tmp_path_factory.mktemp("marked_run") / "run"
    assert pretrain_main(["--config", "configs/tiny.toml", f"--data.dir={data}", f"--out.dir={run}",
                          "--model.vocab_size=400", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
                          "--model.n_kv_heads=1", "--model.max_seq_len=32", "--train.max_steps=2",
                          "--train.eval_interval=2", "--train.eval_batches=1", "--train.batch_size=2"]) == 0
    return data, run


def documents_in(text: str) -> set[str]:
    return {word for word in text.replace(".", " ").split() if word.startswith("doc")}


def test_a_raw_source_is_evaluated_on_its_held_out_documents_only(marked_corpus, marked_checkpoint):
    data, run = marked_checkpoint
    meta = json.loads((data / "meta.json").read_text())
    held_out = {f"doc{int(name[1:3])}" for name in meta["val_names"]}  # d07.txt holds the words of doc7
    assert 0 < len(held_out) < 40
    tokenizer = load_tokenizer(run)
    assert training_val_fraction(run) == 0.25  # read from the checkpoint's training data
    ids = load_eval_tokens(str(marked_corpus), tokenizer, val_fraction=training_val_fraction(run))
    # The same documents, tokenized the same way: exactly the ids data.prepare held out.
    assert np.array_equal(ids, np.fromfile(data / "val.bin", dtype=np.uint16).astype(np.int64))
    assert documents_in(tokenizer.decode(ids.tolist())) == held_out  # no training document is scored
    everything = load_eval_tokens(str(marked_corpus), tokenizer, all_documents=True)
    assert len(documents_in(tokenizer.decode(everything.tolist()))) == 40


def test_eval_commands_score_held_out_documents_of_a_raw_source(marked_corpus, marked_checkpoint, capsys):
    from eval.perplexity import main as perplexity_main

    data, run = marked_checkpoint
    val_tokens = json.loads((data / "meta.json").read_text())["val_tokens"]
    assert perplexity_main(["--checkpoint", str(run), "--data", str(marked_corpus), "--length", "32"]) == 0
    printed = capsys.readouterr().out
    assert "evaluating on held-out documents only" in printed and "val_fraction 0.25" in printed
    assert f"{marked_corpus} is this checkpoint's training source (pass --all-documents" in printed
    scored = int(printed.split(" tokens,")[0].split("| ")[-1].replace(",", ""))
    assert scored == (val_tokens - 1) // 32 * 32
    assert perplexity_main(["--checkpoint", str(run), "--data", str(marked_corpus), "--length", "32",
                            "--all-documents"]) == 0
    assert "training documents included" in capsys.readouterr().out


def scored_tokens(printed: str) -> int:
    return int(printed.split(" tokens,")[0].split("| ")[-1].replace(",", ""))


def test_a_raw_source_the_checkpoint_never_trained_on_is_scored_whole(marked_corpus, marked_checkpoint, tmp_path,
                                                                       capsys):
    """Another file is scored whole (no document dropped); a part of the training folder keeps its held-out
    documents by the hash rule, each document judged alone; a named source is matched by name."""
    from eval.perplexity import main as perplexity_main

    data, run = marked_checkpoint
    other = tmp_path / "other.txt"
    other.write_text("\n<|endoftext|>\n".join(" ".join(f"doc{i} says word{j % 7}." for j in range(60))
                                               for i in range(40)) + "\n")
    tokenizer = load_tokenizer(run)
    whole = load_eval_tokens(str(other), tokenizer, all_documents=True)
    assert perplexity_main(["--checkpoint", str(run), "--data", str(other), "--length", "32"]) == 0
    printed = capsys.readouterr().out
    assert f"evaluating on all {len(whole):,} tokens: {other} is not this checkpoint's training source" in printed
    assert scored_tokens(printed) == (len(whole) - 1) // 32 * 32

    meta = json.loads((data / "meta.json").read_text())
    held_out = sorted(name for name in meta["val_names"])
    trained = sorted({f"d{i:02d}.txt" for i in range(40)} - set(held_out))
    assert meta["source_path"] == str(marked_corpus.resolve())
    one_held_out = marked_corpus / held_out[0]
    ids, line = checkpoint_eval_tokens(str(one_held_out), run, tokenizer)
    assert line.startswith("evaluating on held-out documents only") and "lies inside this checkpoint's training source" in line
    assert np.array_equal(ids, load_eval_tokens(str(one_held_out), tokenizer, all_documents=True))  # all of it
    with pytest.raises(DataError, match="none of the 1 documents .* was held out from training"):
        checkpoint_eval_tokens(str(marked_corpus / trained[0]), run, tokenizer)
    assert training_source_relation("stdlib", run)[0] == OTHER
    _, line = checkpoint_eval_tokens(str(other), run, tokenizer, all_documents=True)
    assert line.startswith(f"evaluating on all {len(whole):,} tokens: {other} is not this checkpoint's training")
    _, line = checkpoint_eval_tokens(str(marked_corpus), run, tokenizer, all_documents=True)
    assert line.startswith("evaluating on all ") and "training documents included (--all-documents)" in line


def test_every_eval_command_makes_the_same_held_out_decision(marked_corpus, marked_checkpoint, tmp_path, capsys):
    from eval.attention_diagnostics import main as attention_main
    from eval.extrapolation import main as extrapolation_main

    _, run = marked_checkpoint
    common = ["--checkpoint", str(run), "--lengths", "1x", "--out", str(tmp_path / "out")]
    for command in (extrapolation_main, attention_main):
        assert command([*common, "--data", str(marked_corpus), "--tokens", "64"]) == 0
        assert "evaluating on held-out documents only" in capsys.readouterr().out
        assert command([*common, "--data", str(marked_corpus), "--tokens", "64", "--all-documents"]) == 0
        assert "training documents included (--all-documents)" in capsys.readouterr().out


def write_hub_layout(root):
    """Small files named and shaped like emozilla/pg19 and Salesforce/wikitext (wikitext-103-raw-v1) on the hub."""
    pg19 = root / "emozilla" / "pg19" / "data"
    pg19.mkdir(parents=True)
    for split, count, shards in (("train", 7, 2), ("validation", 3, 1), ("test", 2, 1)):
        books = [f"{split} book {i}. " + "It was a dark and stormy night. " * 40 for i in range(count)]
        per_shard = -(-count // shards)
        for shard in range(shards):
            part = books[shard * per_shard : (shard + 1) * per_shard]
            table = pa.table({"short_book_title": [f"title {i}" for i in range(len(part))],
                              "publication_date": pa.array([1900] * len(part), pa.int32()),
                              "url": ["https://www.gutenberg.org/"] * len(part), "text": part})
            pq.write_table(table, pg19 / f"{split}-{shard:05d}-of-{shards:05d}-0123abcd.parquet")
    for config in ("wikitext-103-raw-v1", "wikitext-2-raw-v1"):
        folder = root / "Salesforce" / "wikitext" / config
        folder.mkdir(parents=True)
        for split, count in (("train", 5), ("validation", 2), ("test", 2)):
            lines = []
            for article in range(count):
                lines += ["", f" = {config} {split} article {article} = \n", "", f" The text of article {article} . \n",
                          "", " = = A section = = \n", "", " More text , and more . \n"]
            pq.write_table(pa.table({"text": lines}), folder / f"{split}-00000-of-00001.parquet")


def test_a_file_of_any_text_type_is_scored_whole(marked_checkpoint, tmp_path, capsys):
    """A .py (or any) file the user names is read as plain text, one document, scored whole; a folder is read for
    the known extensions only; bytes that are not UTF-8 are refused with the way out."""
    from data.sources import load_local
    from eval.perplexity import main as perplexity_main

    _, run = marked_checkpoint
    script = tmp_path / "module.py"
    script.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(80)))
    assert load_local(script).dataset["text"] == [script.read_text().strip()]
    whole = load_eval_tokens(str(script), load_tokenizer(run), all_documents=True)
    assert perplexity_main(["--checkpoint", str(run), "--data", str(script), "--length", "32"]) == 0
    assert f"evaluating on all {len(whole):,} tokens: {script} is not this checkpoint's training source" in \
        capsys.readouterr().out
    binary = tmp_path / "image.bin"
    binary.write_bytes(b"\x89PNG\x00\xff\xfe")
    assert perplexity_main(["--checkpoint", str(run), "--data", str(binary), "--length", "32"]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_hub_sources_stream_a_capped_train_split_and_their_own_validation_split(tmp_path, monkeypatch):
    write_hub_layout(tmp_path / "mirror")
    monkeypatch.setenv("PELAB_HUB_MIRROR", str(tmp_path / "mirror"))
    books = load_source("pg19", max_documents=5)
    assert len(books.dataset) == 5 and books.dataset[4]["text"].startswith("train book 4.")
    assert [row["text"][:17] for row in books.heldout] == [f"validation book {i}" for i in range(3)]
    wiki = load_source("wikitext103")
    assert len(wiki.dataset) == 5 and len(wiki.heldout) == 2
    assert wiki.heldout[1]["text"].startswith("= wikitext-103-raw-v1 validation article 1 =")
    assert "= = A section = =" in wiki.heldout[1]["text"]  # sections stay inside their article
    out = tmp_path / "prepared"
    assert prepare_main(["--data", "pg19", "--max-documents", "4", "--out", str(out), "--vocab-size", "300",
                         "--num-proc", "1"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["train_documents"], meta["val_documents"]) == (4, 3)
    assert meta["split"] == "the source's validation split" and meta["hub_repo"] == "emozilla/pg19"
    ids = load_eval_tokens("pg19", load_tokenizer(out))  # a raw hub source: its validation split
    assert np.array_equal(ids, np.fromfile(out / "val.bin", dtype=np.uint16).astype(np.int64))


def test_hub_sources_offline_fail_at_once_naming_the_alternatives(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PELAB_HUB_MIRROR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert prepare_main(["--data", "pg19", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert "cannot be reached (offline)" in error and "local .txt" in error and "PELAB_HUB_MIRROR" in error
    monkeypatch.setenv("PELAB_HUB_MIRROR", str(tmp_path))
    with pytest.raises(SourceError, match="has no folder emozilla/pg19"):
        load_source("pg19")
    assert not (tmp_path / "x").exists()


def test_a_file_of_a_named_local_source_counts_as_the_training_source(monkeypatch, tmp_path):
    """A checkpoint trained on the named source stdlib: a path inside the stdlib folder (its meta's stdlib_path)
    may be a training document, so it is judged by the hash rule; a path elsewhere is not the training source."""
    import eval.heldout as heldout

    stdlib = tmp_path / "lib" / "python3.x"
    (stdlib / "json").mkdir(parents=True)
    monkeypatch.setattr(heldout, "training_data_meta", lambda checkpoint: {"source": "stdlib",
                                                                            "stdlib_path": str(stdlib)})
    assert training_source_relation(str(stdlib / "argparse.py"), "run")[0] == INSIDE
    assert training_source_relation(str(stdlib), "run")[0] == SAME
    assert training_source_relation(str(tmp_path), "run")[0] == HOLDS
    assert training_source_relation(str(tmp_path / "elsewhere.py"), "run")[0] == OTHER
    assert training_source_relation("stdlib", "run")[0] == SAME
