"""Evaluation math, passkey prompts, and the extrapolation / passkey / compare commands on tiny models."""
import json
import math

import numpy as np
import pytest
import torch

from data.tokenizer import load_tokenizer
from errors import ConfigError, DataError
from eval.extrapolation import parse_lengths
from eval.passkey import FILLER, INTRO, KEY_LINE, QUESTION, build_prompt, fit_prompt, parse_answer
from eval.perplexity import evaluate_stream, window_plan
from model import Transformer
from model.checkpoint import save_checkpoint
from tests.conftest import micro_config


def uniform_model(vocab_size=97):
    model = Transformer(micro_config(vocab_size=vocab_size, tie_word_embeddings=False))
    torch.nn.init.zeros_(model.lm_head.weight)  # every logit 0: a uniform prediction
    return model


def test_uniform_model_has_perplexity_equal_to_vocab_size():
    ids = np.random.default_rng(0).integers(0, 97, size=1000)
    result = evaluate_stream(uniform_model(), ids, np.ones(97, dtype=np.int64), seq_len=32, progress=False)
    assert result.ppl == pytest.approx(97, rel=1e-5)
    assert result.nll == pytest.approx(math.log(97), rel=1e-6)


def test_bits_per_byte_is_nll_over_ln2_times_tokens_over_bytes():
    ids = np.random.default_rng(1).integers(0, 97, size=700)
    byte_lengths = np.random.default_rng(2).integers(0, 4, size=97)
    result = evaluate_stream(uniform_model(), ids, byte_lengths, seq_len=16, progress=False)
    windows = (700 - 1) // 16
    scored_targets = ids[1 : windows * 16 + 1]
    assert result.tokens == windows * 16
    assert result.bytes == int(byte_lengths[scored_targets].sum())
    assert result.bpb == pytest.approx(result.nll / math.log(2) * result.tokens / result.bytes, rel=1e-9)


@pytest.mark.parametrize("n_tokens, seq_len, stride", [(1000, 64, 16), (1000, 64, 64), (257, 32, 5), (65, 64, 1)])
def test_sliding_window_scores_every_token_exactly_once(n_tokens, seq_len, stride):
    counts = np.zeros(n_tokens, dtype=int)
    for start, skip in window_plan(n_tokens, seq_len, stride):
        assert start + seq_len < n_tokens
        counts[start + 1 + skip : start + seq_len + 1] += 1
    last = max(start + seq_len for start, _ in window_plan(n_tokens, seq_len, stride))
    assert np.all(counts[1 : last + 1] == 1) and counts[0] == 0
    assert n_tokens - 1 - last < stride  # at most the tail shorter than one stride is left out
    result = evaluate_stream(uniform_model(), np.arange(n_tokens) % 97, np.ones(97, dtype=np.int64), seq_len, stride,
                             progress=False)
    assert result.tokens == last


def test_window_plan_errors():
    with pytest.raises(DataError, match="need more than seq_len"):
        window_plan(10, 10, None)
    with pytest.raises(ConfigError, match="--stride must be between 1 and --length"):
        window_plan(100, 10, 11)


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("length", [250, 500, 900])
def test_passkey_prompt_construction(prepared_data, depth, length):
    tokenizer = load_tokenizer(prepared_data)
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    prompt, tokens = fit_prompt(31337, length, depth, count)
    assert tokens == count(prompt) <= length
    lines = prompt.split("\n")
    assert lines[0] == INTRO and lines[2] == KEY_LINE.format(key=31337) and lines[4] == QUESTION
    before, after = lines[1].count(FILLER), lines[3].count(FILLER)
    assert before == round(depth * (before + after))
    # Filling is maximal: one more filler sentence would not fit.
    assert count(build_prompt(31337, before + after + 1, depth)) > length


def test_passkey_answer_parsing():
    assert parse_answer(" 4721. Remember it") == 4721
    assert parse_answer(" the key 12 and 99") == 12
    assert parse_answer(" unknown") is None
    assert parse_answer("") is None


def test_passkey_too_short_length_is_refused(prepared_data):
    tokenizer = load_tokenizer(prepared_data)
    with pytest.raises(ConfigError, match="too short for the passkey template"):
        fit_prompt(1, 10, 0.5, lambda text: len(tokenizer.encode(text)))


def test_lengths_parsing():
    assert parse_lengths("1x, 2x,4096") == ["1x", "2x", "4096"]
    with pytest.raises(ConfigError, match="must be a multiple like 4x"):
        parse_lengths("1x,big")


@pytest.fixture(scope="module")
def tiny_checkpoints(prepared_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpts")
    tokenizer = load_tokenizer(prepared_data)
    paths = []
    for position in ("rope", "alibi", "learned"):
        torch.manual_seed(0)
        model = Transformer(micro_config(position=position, vocab_size=512, max_seq_len=16))
        save_checkpoint(folder / position, model, tokenizer, {"trained_seq_len": 16, "step": 0})
        paths.append(str(folder / position))
    return paths


def test_extrapolation_command(tiny_checkpoints, prepared_data, tmp_path, capsys):
    from eval.extrapolation import main

    out = tmp_path / "extrap"
    assert main(["--checkpoint", *tiny_checkpoints, "--lengths", "1x,2x,4x", "--methods", "yarn,dynamic,clamp",
                 "--data", str(prepared_data), "--tokens", "512", "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())
    labels = {row["label"] for row in rows}
    assert labels == {"rope", "rope+yarn", "rope+dynamic", "alibi", "learned", "learned+clamp"}
    for row in rows:
        if row["label"] == "learned" and row["multiple"] > 1:
            assert row["ppl"] is None and "beyond the learned table" in row["error"]
            continue
        assert row["ppl"] > 1 and row["tokens"] == 512  # the same tokens at every length
        assert (row.get("penalty") is not None) == (row["multiple"] > 1)
    # At 1x every method is the checkpoint as trained.
    at_1x = {row["label"]: row["ppl"] for row in rows if row["multiple"] == 1}
    assert at_1x["rope+yarn"] == pytest.approx(at_1x["rope"]) == pytest.approx(at_1x["rope+dynamic"])
    table = (out / "table.md").read_text()
    assert "| rope+yarn |" in table and "n/a" in table and "Extrapolation penalty" in table
    assert (out / "plot.png").stat().st_size > 10_000
    # Without --data, a checkpoint that does not record its training data gets a clear error.
    capsys.readouterr()
    assert main(["--checkpoint", tiny_checkpoints[0], "--out", str(tmp_path / "x")]) == 2
    assert "does not record the data it was trained on" in capsys.readouterr().err


def test_passkey_cli_and_training_data(tiny_checkpoints, tmp_path):
    from eval.passkey import main

    assert main(["--checkpoint", tiny_checkpoints[0], "--lengths", "16x,32x", "--depths", "0,1", "--trials", "2",
                 "--out", str(tmp_path / "pk")]) == 0
    result = json.loads((tmp_path / "pk" / "results.json").read_text())
    assert [(row["length"], row["depth"]) for row in result["rows"]] == [(256, 0.0), (256, 1.0), (512, 0.0), (512, 1.0)]
    for row in result["rows"]:
        assert row["prompt_tokens"] <= row["length"] and len(row["answers"]) == row["trials"] == 2
        assert row["accuracy"] == sum(a["answer"] == a["key"] for a in row["answers"]) / row["trials"]
    assert (tmp_path / "pk" / "passkey.png").exists()
    assert main(["--make-data", str(tmp_path / "pk.jsonl"), "--checkpoint", tiny_checkpoints[0], "--lengths", "256",
                 "--samples", "5"]) == 0
    documents = [json.loads(line)["text"] for line in (tmp_path / "pk.jsonl").read_text().splitlines()]
    assert len(documents) == 5
    for text in documents:
        key = parse_answer(text.split("The pass key is ", 1)[1])
        assert text.endswith(f"The pass key is {key}.")


def test_passkey_scores_an_oracle_as_right_and_a_fixed_answer_as_wrong(tiny_checkpoints, monkeypatch):
    """The scoring can tell: a model that reads the key from the prompt gets 100%, one that always answers
    12345 gets 0% (the keys drawn here are not 12345)."""
    import re

    import eval.passkey as passkey
    from data.tokenizer import load_tokenizer
    from model.checkpoint import load_model

    model, tokenizer = load_model(tiny_checkpoints[0]), load_tokenizer(tiny_checkpoints[0])

    def oracle(model, ids, new_tokens, **kwargs):
        key = re.search(r"The pass key is (\d+)", tokenizer.decode(ids)).group(1)
        return iter(tokenizer.encode(f" {key}.", add_special_tokens=False))

    monkeypatch.setattr(passkey, "generate_tokens", oracle)
    rows = passkey.evaluate_passkey(model, tokenizer, [256, 512], [0.0, 0.5, 1.0], 3, seed=0)
    assert [row["accuracy"] for row in rows] == [1.0] * 6
    monkeypatch.setattr(passkey, "generate_tokens",
                        lambda *a, **k: iter(tokenizer.encode(" 12345.", add_special_tokens=False)))
    rows = passkey.evaluate_passkey(model, tokenizer, [256], [0.5], 3, seed=0)
    assert all(a["key"] != 12345 for a in rows[0]["answers"]) and rows[0]["accuracy"] == 0.0
