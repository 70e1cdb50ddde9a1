"""Byte-level BPE tokenizer: training with `tokenizers`, ChatML template, save/load through transformers."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from errors import ConfigError, DataError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, PAD]

# ChatML, as used by MiniMind and Qwen: <|im_start|>role\ncontent<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on `texts`. The vocabulary holds the 256 bytes, the special tokens and merges."""
    minimum = 256 + len(SPECIAL_TOKENS)
    if vocab_size <= minimum:
        raise ConfigError(f"vocab_size must be larger than {minimum} (256 bytes + special tokens), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around a `tokenizers.Tokenizer`, with the special tokens and the chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=ENDOFTEXT,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load from a folder written by `save_pretrained`, or from a bare tokenizer.json (template added)."""
    path = Path(path)
    if path.is_dir() and (path / "tokenizer_config.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.exists():
        raise DataError(f"no tokenizer at {path}: expected tokenizer.json (from data.prepare)")
    return wrap_tokenizer(Tokenizer.from_file(str(file)))


def leading_ids(tokenizer) -> list[int]:
    """The ids a tokenizer puts before a text of its own accord: [<bos>] for Gemma's, [] for SmolLM2's and ours. A
    window read from the middle of a text starts with them, as the model saw every text start in training."""
    return list(tokenizer.encode("", add_special_tokens=True))


def token_byte_lengths(tokenizer: PreTrainedTokenizerFast) -> np.ndarray:
    """UTF-8 bytes of text that each token id stands for (0 for special tokens), for bits-per-byte.

    In a byte-level BPE every character of a token's string stands for exactly one byte."""
    lengths = np.zeros(len(tokenizer), dtype=np.int64)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    for token, token_id in tokenizer.get_vocab().items():
        lengths[token_id] = 0 if token_id in special else len(token)
    return lengths


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
