"""Byte-level BPE: special tokens, round trips, loading through transformers."""
import pytest
from transformers import AutoTokenizer

from data.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, load_tokenizer, train_bpe, wrap_tokenizer
from errors import ConfigError

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. 猫追老鼠，老鼠追猫。",
    "Emoji 🐍🚀 and accents: café, naïve, Ærøskøbing.",
] * 30


@pytest.fixture(scope="module")
def tokenizer():
    return wrap_tokenizer(train_bpe(TEXTS, vocab_size=400))


def test_special_tokens_come_first(tokenizer):
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert 300 < len(tokenizer) <= 400  # a small corpus can run out of merges before 400


@pytest.mark.parametrize(
    "text",
    [
        "print('hello')\n\tx = [1, 2, 3]  # tabs and spaces  \n",
        "西游记 第一回　灵根育孕源流出",
        "mixed 🐍 emoji 👩‍👩‍👧 ZWJ and 🇫🇷 flags, never seen in training: 🦜",
        "",
    ],
)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_special_tokens_are_single_ids(tokenizer):
    ids = tokenizer.encode("a<|im_start|>user\nhi<|im_end|><|endoftext|>", add_special_tokens=False)
    assert 1 in ids and 2 in ids and ids[-1] == 0


def test_saved_tokenizer_loads_with_autotokenizer_and_renders_chatml(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "猫追老鼠 🐱 def f(): pass"
    assert loaded.encode(text) == tokenizer.encode(text)
    rendered = loaded.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert load_tokenizer(tmp_path).chat_template == CHAT_TEMPLATE


def test_bare_tokenizer_json_loads_with_template(tokenizer, tmp_path):
    tokenizer.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert loaded.chat_template == CHAT_TEMPLATE
    assert loaded.encode("abc") == tokenizer.encode("abc")


def test_too_small_vocab_is_refused():
    with pytest.raises(ConfigError, match="vocab_size must be larger than 260"):
        train_bpe(TEXTS, vocab_size=100)
