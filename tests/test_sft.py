"""SFT: loss labels cover exactly the assistant turns, padding is ignored, long conversations cut on turn
boundaries, bad records rejected clearly; train.sft and chat end to end."""
import ast
import json

import pytest
import torch

from data.sft import check_conversation, encode_conversation, pad_batch, stdlib_conversations
from data.tokenizer import load_tokenizer
from errors import ConfigError, ConversationError
from infer.generate import fit_conversation
from model import IGNORE_INDEX, Transformer
from tests.conftest import micro_config

SINGLE = [{"role": "user", "content": "Write add."}, {"role": "assistant", "content": "def add(a, b):\n    return a + b"}]
MULTI = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "Write add."},
    {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
    {"role": "user", "content": "Now sub, 减法 🐍."},
    {"role": "assistant", "content": " def sub(a, b): return a - b  # 减"},
]


@pytest.fixture(scope="module")
def tokenizer(prepared_data):
    return load_tokenizer(prepared_data)


def labelled_text(tokenizer, example):
    """The labelled tokens, decoded run by run (a run = consecutive labelled tokens)."""
    runs, current = [], []
    for token, label in zip(example.input_ids, example.labels):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


@pytest.mark.parametrize("messages", [SINGLE, MULTI], ids=["single", "multi"])
def test_labels_cover_exactly_the_assistant_turns(tokenizer, messages):
    example = encode_conversation(tokenizer, messages, max_tokens=10_000)
    expected = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert labelled_text(tokenizer, example) == expected
    unlabelled = tokenizer.decode([t for t, l in zip(example.input_ids, example.labels) if l == IGNORE_INDEX])
    for message in messages:
        if message["role"] != "assistant":
            assert message["content"] in unlabelled
    assert unlabelled.count("<|im_start|>assistant\n") == len(expected)  # role headers are not learned
    assert tokenizer.decode(example.input_ids) == tokenizer.apply_chat_template(messages, tokenize=False)


def test_padding_never_contributes_to_the_loss(tokenizer):
    examples = [encode_conversation(tokenizer, m, 10_000) for m in (SINGLE, MULTI)]
    model = Transformer(micro_config(vocab_size=len(tokenizer), max_seq_len=128)).eval()
    inputs, targets = pad_batch(examples, tokenizer.pad_token_id)
    assert inputs.shape[1] == max(len(e.input_ids) for e in examples) - 1
    assert torch.all(targets[0, len(examples[0].input_ids) - 1 :] == IGNORE_INDEX)
    with torch.no_grad():
        _, batched = model(inputs, targets, loss_reduction="sum")
        alone = sum(model(*pad_batch([e], tokenizer.pad_token_id), loss_reduction="sum")[1] for e in examples)
        # Another padding token changes nothing either.
        _, other_pad = model(*pad_batch(examples, pad_id=7), loss_reduction="sum")
    assert torch.allclose(batched, alone, rtol=1e-5)
    assert torch.allclose(batched, other_pad, rtol=1e-5)


def test_long_conversations_are_cut_on_turn_boundaries_or_dropped(tokenizer):
    full = encode_conversation(tokenizer, MULTI, 10_000)
    first_turn_end = max(i for i, label in enumerate(full.labels[: len(full.labels) // 2 + 8]) if label != IGNORE_INDEX)
    cut = encode_conversation(tokenizer, MULTI, len(full.input_ids) - 1)
    assert cut.truncated and labelled_text(tokenizer, cut) == [MULTI[2]["content"] + "<|im_end|>"]
    assert cut.input_ids == full.input_ids[: len(cut.input_ids)] and len(cut.input_ids) > first_turn_end
    assert encode_conversation(tokenizer, MULTI, 12) is None


@pytest.mark.parametrize(
    "record, message",
    [
        ({"conversations": [{"role": "bot", "content": "x"}]}, "role 'bot' is not one of"),
        ({"conversations": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}]}, "empty or missing"),
        ({"conversations": [{"role": "user", "content": "x"}]}, "no assistant message"),
        ({"text": "x"}, "expected a non-empty 'conversations' list"),
    ],
)
def test_malformed_conversations_are_rejected(record, message):
    with pytest.raises(ConversationError, match=message):
        check_conversation(record, "data.jsonl, record 3")


@pytest.mark.integration  # pretrain and SFT end to end, ~45 s
def test_stdlib_conversations_answer_with_real_source():
    records = stdlib_conversations()
    assert len(records) > 1000
    for record in records[:: max(1, len(records) // 200)]:
        question, answer = (m["content"] for m in record["conversations"])
        assert question.startswith("Write the ") and "of the Python module" in question
        tree = ast.parse(answer)  # a whole, dedented function definition
        assert isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name in question


def test_fit_conversation_drops_oldest_turns(tokenizer):
    long_history = [{"role": "system", "content": "sys"}] + [
        {"role": role, "content": f"m{i} " * 10} for i in range(10) for role in ("user", "assistant")
    ][:-1]
    ids, kept = fit_conversation(tokenizer, long_history, budget=120)
    assert len(ids) <= 120 and kept[0]["role"] == "system" and kept[-1] == long_history[-1]
    assert len(kept) < len(long_history)
    with pytest.raises(ConfigError, match="the last message alone takes"):
        fit_conversation(tokenizer, [{"role": "user", "content": "x " * 400}], budget=50)


def write_conversations(path, count):
    rows = []
    for i in range(count):
        name = f"f{i}"
        rows.append({"conversations": [{"role": "user", "content": f"Write {name}."},
                                       {"role": "assistant", "content": f"def {name}(x):\n    return x + {i % 7}"}]})
    path.write_text("\n".join(json.dumps(row) for row in rows))


def test_sft_end_to_end_learns_the_format(prepared_data, tmp_path, capsys):
    from infer.generate import chat_reply
    from train.pretrain import main as pretrain
    from train.sft import main as sft

    base = ["--model.vocab_size=512", "--model.dim=64", "--model.n_layers=2", "--model.n_heads=4",
            "--model.n_kv_heads=2", "--model.max_seq_len=64", "--train.batch_size=8", "--train.eval_batches=2",
            "--train.dtype=float32"]
    assert pretrain([*base, "--train.max_steps=30", f"--data.dir={prepared_data}", f"--out.dir={tmp_path / 'pt'}"]) == 0
    write_conversations(tmp_path / "chat.jsonl", 300)
    assert sft(["--checkpoint", str(tmp_path / "pt"), f"--data.source={tmp_path / 'chat.jsonl'}", "--data.val_fraction=0.1",
                "--train.max_steps=150", "--train.lr=3e-3", "--train.warmup_steps=10", "--train.eval_interval=50",
                "--train.batch_size=8", "--train.dtype=float32", f"--out.dir={tmp_path / 'sft'}"]) == 0
    state = json.loads((tmp_path / "sft" / "trainer_state.json").read_text())
    assert state["task"] == "sft" and state["sft"]["val"] > 0
    assert state["val_loss"] < 0.5 * state["initial_val_loss"]  # held-out conversations: far below the pretrained model
    from model.checkpoint import load_model

    model = load_model(tmp_path / "sft")
    reply, ended = chat_reply(model, load_tokenizer(tmp_path / "sft"), [{"role": "user", "content": "Write f1000."}],
                              max_new_tokens=30, temperature=0, stream=open("/dev/null", "w"))
    assert ended and reply.startswith("def f")
    # The same through the command line: one turn with --prompt, and an interactive chat on stdin.
    import subprocess
    import sys

    from scripts.generate import main as generate
    from tests.conftest import ROOT

    capsys.readouterr()
    assert generate(["--checkpoint", str(tmp_path / "sft"), "--chat", "--prompt", "Write f1000.", "--temperature", "0",
                     "--max-new-tokens", "30"]) == 0
    assert capsys.readouterr().out.strip() == reply.strip()
    chat = subprocess.run([sys.executable, "-m", "scripts.generate", "--checkpoint", str(tmp_path / "sft"), "--chat",
                           "--temperature", "0", "--max-new-tokens", "30"], cwd=ROOT, capture_output=True, text=True,
                          input="Write f1000.\n/reset\nWrite f1001.\n\n", timeout=120)
    assert chat.returncode == 0, chat.stderr[-2000:]
    replies = [part.split("user>")[0].strip() for part in chat.stdout.split("assistant> ")[1:]]  # drop the prompts
    assert len(replies) == 2 and replies[0].strip() == reply.strip() and replies[1].startswith("def f")
    # Without --checkpoint, train.sft refuses to start.
    with pytest.raises(SystemExit):
        sft(["--data.source=stdlib"])
