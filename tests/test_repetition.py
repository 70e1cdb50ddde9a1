"""Repetition controls (infer/repetition.py): equal to transformers' logits processors, honoured by cached and
compiled decoding, and refused with the flag's name when out of range."""
import pytest
import torch
from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from errors import ConfigError
from infer.generate import generate_tokens, sample_next
from infer.repetition import ban_repeated_ngrams, repetition_penalty, repetition_processors
from model import Transformer
from tests.conftest import micro_config


def random_case(batch: int = 3, length: int = 40, vocab: int = 11, seed: int = 0):
    """Ids from a small vocabulary (so n-grams repeat) and logits of both signs, with some exact zeros."""
    generator = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab, (batch, length), generator=generator)
    logits = torch.randn(batch, vocab, generator=generator) * 3
    logits[:, 0] = 0.0
    return context, logits


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0, 1.0])
@pytest.mark.parametrize("length", [1, 5, 40])
def test_repetition_penalty_equals_transformers(penalty, length):
    context, logits = random_case(length=length, seed=length)
    ours = repetition_penalty(context, logits, penalty)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(context, logits.clone())
    assert (ours - theirs).abs().max() < 1e-6
    untouched = torch.ones_like(logits, dtype=torch.bool).scatter(1, context, False)
    assert torch.equal(ours[untouched], logits[untouched])  # tokens not in the context keep their logits


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 6, 40])
def test_no_repeat_ngram_equals_transformers(size, length):
    context, logits = random_case(length=length, vocab=5 if size > 2 else 11, seed=10 * size + length)
    if length == 40 and size > 1:  # the context starts with its own last size - 1 tokens: one ban at least
        context[:, : size - 1] = context[:, length + 1 - size :]
    ours = ban_repeated_ngrams(context, logits, size)
    theirs = NoRepeatNGramLogitsProcessor(size)(context, logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert (ours[finite] - theirs[finite]).abs().max() < 1e-6
    if length == 40:
        assert torch.isinf(ours).any(dim=-1).all()  # every row bans something


def test_both_processors_in_transformers_order():
    context, logits = random_case(seed=7)
    ours = logits
    for process in repetition_processors(1.4, 2):
        ours = process(context, ours)
    theirs = NoRepeatNGramLogitsProcessor(2)(context, RepetitionPenaltyLogitsProcessor(1.4)(context, logits.clone()))
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert (ours[torch.isfinite(ours)] - theirs[torch.isfinite(theirs)]).abs().max() < 1e-6
    assert repetition_processors(1.0, 0) == []  # off: decoding is untouched


def reference_tokens(model, prompt, new, penalty, size, temperature=0.0, top_k=0, seed=None):
    """Generation without a cache: a full forward of every prefix, the processors, then the same sampling."""
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new):
            logits = model(torch.tensor([ids]))[0][:, -1].float()
            for process in repetition_processors(penalty, size):
                logits = process(torch.tensor([ids]), logits)
            ids.append(int(sample_next(logits, temperature, top_k, 1.0, generator)))
    return ids[len(prompt) :]


@pytest.mark.parametrize("penalty,size", [(10.0, 0), (1.0, 2), (1.3, 3)])
def test_cached_generation_with_repetition_controls_equals_full_forwards(penalty, size):
    model = Transformer(micro_config(max_seq_len=16)).eval()
    prompt = [5, 17, 3, 42, 5, 17]
    cached = list(generate_tokens(model, prompt, 30, temperature=0, repetition_penalty=penalty, no_repeat_ngram=size))
    assert cached == reference_tokens(model, prompt, 30, penalty, size)
    assert cached != list(generate_tokens(model, prompt, 30, temperature=0))  # the controls change the output
    if size:
        everything = prompt + cached
        ngrams = [tuple(everything[i : i + size]) for i in range(len(everything) - size + 1)]
        assert len(set(ngrams[len(prompt) - size + 1 :])) == len(ngrams[len(prompt) - size + 1 :])
        assert not set(ngrams[len(prompt) - size + 1 :]) & set(ngrams[: len(prompt) - size + 1])
    sampled = list(generate_tokens(model, prompt, 20, temperature=0.9, top_k=30, seed=4, repetition_penalty=penalty,
                                   no_repeat_ngram=size))
    assert sampled == reference_tokens(model, prompt, 20, penalty, size, temperature=0.9, top_k=30, seed=4)


def test_compiled_decoding_honours_the_repetition_controls():
    model = Transformer(micro_config(max_seq_len=16)).eval()
    prompt = [5, 17, 3, 42]
    controls = dict(repetition_penalty=1.3, no_repeat_ngram=2)
    eager = list(generate_tokens(model, prompt, 20, temperature=0, **controls))
    assert list(generate_tokens(model, prompt, 20, temperature=0, compile=True, **controls)) == eager


@pytest.mark.parametrize("controls,flag", [({"repetition_penalty": 0.0}, "--repetition-penalty"),
                                          ({"repetition_penalty": -1.2}, "--repetition-penalty"),
                                          ({"repetition_penalty": float("nan")}, "--repetition-penalty"),
                                          ({"no_repeat_ngram": -1}, "--no-repeat-ngram")])
def test_bad_values_name_the_flag(controls, flag, capsys, tmp_path):
    from scripts.generate import main as generate_main

    model = Transformer(micro_config()).eval()
    with pytest.raises(ConfigError, match=flag):
        list(generate_tokens(model, [1, 2], 3, **controls))
    (name, value), = controls.items()
    argv = ["--checkpoint", str(tmp_path / "none"), "--prompt", "x", f"--{name.replace('_', '-')}", str(value)]
    for chat in ([], ["--chat"]):
        assert generate_main(argv + chat) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"error: {flag} must be") and "\n" not in error
