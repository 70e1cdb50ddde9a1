"""Sampling, KV-cached generation, streaming, and the CLI end to end."""
import io
import subprocess
import sys

import pytest
import torch

from data.tokenizer import load_tokenizer
from infer.generate import StreamPrinter, generate_tokens, sample_next
from model import Transformer
from tests.conftest import ROOT, micro_config


def test_greedy_equals_argmax_of_repeated_full_forwards():
    model = Transformer(micro_config(max_seq_len=16)).eval()
    prompt = [5, 17, 3, 42]
    # 30 new tokens run past the trained length of 16: the cache is sized for the request.
    generated = list(generate_tokens(model, prompt, max_new_tokens=30, temperature=0))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(30):
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert generated == ids[len(prompt) :]


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_compiled_static_cache_decoding_equals_eager_decoding(position):
    """--compile: the one-token steps run compiled over a StaticKVCache; the tokens must not change."""
    model = Transformer(micro_config(max_seq_len=16, position=position)).eval()
    prompt = [5, 17, 3, 42]
    eager = list(generate_tokens(model, prompt, max_new_tokens=20, temperature=0))
    assert list(generate_tokens(model, prompt, max_new_tokens=20, temperature=0, compile=True)) == eager
    sampled = list(generate_tokens(model, prompt, 20, temperature=1.0, top_k=20, seed=3))
    # a second compiled call (other lengths, same model) reuses the compiled step
    assert list(generate_tokens(model, prompt, 20, temperature=1.0, top_k=20, seed=3, compile=True)) == sampled


def test_seed_makes_sampling_reproducible():
    model = Transformer(micro_config()).eval()
    first = list(generate_tokens(model, [1, 2, 3], 25, temperature=1.0, seed=7))
    again = list(generate_tokens(model, [1, 2, 3], 25, temperature=1.0, seed=7))
    other = list(generate_tokens(model, [1, 2, 3], 25, temperature=1.0, seed=8))
    assert first == again
    assert first != other


def test_stop_ids_end_generation():
    model = Transformer(micro_config()).eval()
    greedy = list(generate_tokens(model, [1, 2, 3], 10, temperature=0))
    stopped = list(generate_tokens(model, [1, 2, 3], 10, temperature=0, stop_ids=(greedy[2],)))
    assert stopped == greedy[: greedy.index(greedy[2]) + 1]


def test_top_k_and_top_p_restrict_the_candidates():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).expand(2000, -1)
    generator = torch.Generator().manual_seed(0)
    top2 = sample_next(logits, temperature=1.0, top_k=2, generator=generator)
    assert set(top2.tolist()) == {0, 1}
    # softmax([3, 2, 1, 0, -1]) = [.64, .24, .09, .03, .01]: top_p 0.8 keeps the first two tokens only.
    nucleus = sample_next(logits, temperature=1.0, top_p=0.8, generator=generator)
    assert set(nucleus.tolist()) == {0, 1}
    assert torch.equal(sample_next(logits, temperature=0), torch.zeros(2000, dtype=torch.long))
    full = sample_next(logits, temperature=1.0, generator=generator)
    assert set(full.tolist()) == {0, 1, 2, 3, 4}


def test_stream_printer_never_splits_characters(prepared_data):
    tokenizer = load_tokenizer(prepared_data)
    text = "x = '猫追老鼠 🐍'\n"
    stream = io.StringIO()
    printer = StreamPrinter(tokenizer, stream)
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        printer.add(token_id)
        assert "\ufffd" not in stream.getvalue()
    assert stream.getvalue() == text == printer.text()


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.integration  # pretrain and generate as subprocesses
def test_pretrain_then_generate_end_to_end(prepared_data, tmp_path):
    out = tmp_path / "run"
    result = run(
        "train.pretrain", "--config", "configs/tiny.toml", f"--data.dir={prepared_data}", f"--out.dir={out}",
        "--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.max_seq_len=64",
        "--train.max_steps=20", "--train.batch_size=4", "--train.eval_interval=10", "--train.log_interval=5",
    )
    assert result.returncode == 0, result.stderr
    assert "final val_loss" in result.stdout
    for name in ("model.safetensors", "config.json", "tokenizer.json", "trainer_state.json", "training_state.pt",
                 "metrics.jsonl", "run_config.toml"):
        assert (out / name).exists(), name
    samples = [run("scripts.generate", "--checkpoint", str(out), "--prompt", "def ", "--max-new-tokens", "20",
                   "--seed", "3") for _ in range(2)]
    assert samples[0].returncode == 0, samples[0].stderr
    assert samples[0].stdout.startswith("def ") and len(samples[0].stdout) > len("def \n")
    assert samples[0].stdout == samples[1].stdout

    again = run("train.pretrain", "--config", "configs/tiny.toml", f"--data.dir={prepared_data}", f"--out.dir={out}")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    missing = run("scripts.generate", "--checkpoint", str(tmp_path / "nope"), "--prompt", "x")
    assert missing.returncode == 2 and "no such checkpoint folder" in missing.stderr


@pytest.mark.integration  # pretrain and generate as subprocesses, ~35 s
def test_generate_cli_rope_scaling_flags(prepared_data, tmp_path):
    out = tmp_path / "run"
    result = run(
        "train.pretrain", f"--data.dir={prepared_data}", f"--out.dir={out}", "--model.vocab_size=512",
        "--model.dim=64", "--model.n_layers=1", "--model.max_seq_len=16", "--train.max_steps=2",
        "--train.batch_size=2", "--train.eval_batches=1",
    )
    assert result.returncode == 0, result.stderr
    common = ("scripts.generate", "--checkpoint", str(out), "--prompt", "def ", "--max-new-tokens", "40",
              "--temperature", "0")
    plain, scaled = run(*common, "--extrapolate"), run(*common, "--rope-scaling", "yarn", "--rope-factor", "4",
                                      "--rope-param", "beta_fast=16")
    assert plain.returncode == scaled.returncode == 0, scaled.stderr
    bad = run(*common, "--rope-scaling", "yarn", "--rope-factor", "0.5")
    assert bad.returncode == 2 and "factor >= 1" in bad.stderr
    orphan = run(*common, "--rope-factor", "2")
    assert orphan.returncode == 2 and "need --rope-scaling" in orphan.stderr
    # Attention methods: on the same command line, alone or with a scaling; refused with one line where inapplicable.
    methods = run(*common, "--attention-method", "rerope:window=4", "--attention-method", "logn")
    assert methods.returncode == 0, methods.stderr
    combined = run(*common, "--attention-method", "logn", "--rope-scaling", "yarn", "--rope-factor", "4")
    assert combined.returncode == 0, combined.stderr
    conflict = run(*common, "--attention-method", "rerope", "--attention-method", "selfextend")
    assert conflict.returncode == 2 and "each sets positions" in conflict.stderr and "Traceback" not in conflict.stderr
    malformed = run(*common, "--attention-method", "rerope:window")
    assert malformed.returncode == 2 and "NAME:KEY=VALUE" in malformed.stderr


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_chat_reset_says_the_conversation_starts_over_and_does(system, prepared_data, tmp_path, monkeypatch, capsys):
    """/reset prints one confirming line (naming the system message it keeps) and the next turn sees only itself."""
    import scripts.generate as generate
    from tests.conftest import train_micro_run

    run = train_micro_run(prepared_data, tmp_path / "run")
    seen = []

    def reply(model, tokenizer, messages, max_new_tokens, **sampling):
        seen.append([dict(message) for message in messages])
        return "ok", True

    monkeypatch.setattr(generate, "chat_reply", reply)
    monkeypatch.setattr("sys.stdin", io.StringIO("first\n/reset\nsecond\n\n"))
    capsys.readouterr()
    assert generate.main(["--checkpoint", str(run), "--chat", *(["--system", system] if system else [])]) == 0
    err = capsys.readouterr().err
    confirmations = [line for line in err.splitlines() if "conversation reset" in line]
    assert len(confirmations) == 1 and (("system message is kept" in confirmations[0]) == bool(system)), err
    kept = [{"role": "system", "content": system}] if system else []
    assert seen == [kept + [{"role": "user", "content": "first"}], kept + [{"role": "user", "content": "second"}]]
