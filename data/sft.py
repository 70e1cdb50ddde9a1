"""Conversations -> token ids + loss labels for supervised fine-tuning (chat).

Format: MiniMind's conversation jsonl, {"conversations": [{"role": "user"|"assistant"|"system", "content": ...}]},
read with `datasets`. Conversations are rendered with the tokenizer's ChatML template; the loss covers the
assistant turns only: each assistant's content and its <|im_end|> marker (not the role header, not the
user or system text, not padding). A conversation longer than the limit is cut after the last assistant
turn that fits, or dropped when none fits; both are counted and reported, never cut mid-answer.

Named sources: `stdlib` (offline default: one conversation per documented public standard-library function
or method of at most 700 characters: the user gives its signature, module and docstring summary, the
assistant answers with its source (methods dedented out of their class)), a local .jsonl/.json path, or `minimind` (MiniMind's sft_mini_512.jsonl, online only).
"""
from __future__ import annotations

import ast
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import datasets
import numpy as np
import torch

from data.batches import IGNORE_INDEX
from data.prepare import is_validation
from data.sources import _hub_is_reachable, check_utf8, stdlib_files
from data.tokenizer import IM_END
from errors import ConversationError, SourceError

ROLES = ("system", "user", "assistant")


def check_conversation(record: Any, where: str) -> list[dict[str, str]]:
    """The messages of one record, or ConversationError naming the record and what is wrong."""
    messages = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ConversationError(f"{where}: expected a non-empty 'conversations' list of {{role, content}} messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            role = message.get("role") if isinstance(message, dict) else message
            raise ConversationError(f"{where}, message {index}: role {role!r} is not one of {list(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ConversationError(f"{where}, message {index}: empty or missing 'content'")
    if not any(message["role"] == "assistant" for message in messages):
        raise ConversationError(f"{where}: no assistant message, so there is nothing to learn from")
    return [{"role": message["role"], "content": message["content"]} for message in messages]


@dataclass
class SFTExample:
    input_ids: list[int]
    labels: list[int]  # = input_ids where the loss applies, IGNORE_INDEX elsewhere (not yet shifted)
    truncated: bool = False


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int, int]]]:
    """The rendered text and, per assistant turn, (content start, end of its <|im_end|>, end of the turn)."""
    full = render(tokenizer, messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:index], add_generation_prompt=True)
        through = render(tokenizer, messages[: index + 1])
        if not (through.startswith(before) and full.startswith(through)):
            raise ConversationError("the chat template does not render conversations as growing prefixes")
        spans.append((len(before), through.rindex(IM_END) + len(IM_END), len(through)))
    return full, spans


def encode_conversation(tokenizer, messages: list[dict], max_tokens: int) -> SFTExample | None:
    """Ids and labels for one conversation, cut after the last assistant turn within max_tokens (None: none fits)."""
    full, spans = assistant_spans(tokenizer, messages)
    encoding = tokenizer(full, return_offsets_mapping=True, add_special_tokens=False)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    labels = [
        token if any(start <= begin and end <= stop for start, stop, _ in spans) else IGNORE_INDEX
        for token, (begin, end) in zip(ids, offsets)
    ]
    if len(ids) <= max_tokens:
        return SFTExample(ids, labels)
    for _, _, turn_end in reversed(spans):
        keep = sum(1 for _, end in offsets if end <= turn_end)
        if keep <= max_tokens:
            return SFTExample(ids[:keep], labels[:keep], truncated=True)
    return None


def stdlib_conversations(max_source_chars: int = 700) -> list[dict]:
    """One conversation per documented module-level function of this machine's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    records = []
    for path in stdlib_files(root):
        text = path.read_bytes().decode("utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        functions = [(node, "function", node.name) for node in tree.body if isinstance(node, ast.FunctionDef)]
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")):
            functions += [(node, "method", f"{cls.name}.{node.name}") for node in cls.body
                          if isinstance(node, ast.FunctionDef)]
        for node, kind, name in functions:
            docstring = ast.get_docstring(node)
            if node.name.startswith("_") or not docstring:
                continue
            source = textwrap.dedent(ast.get_source_segment(text, node, padded=True) or "")
            if not source or len(source) > max_source_chars:
                continue
            summary = docstring.strip().splitlines()[0].strip()
            question = f"Write the {kind} `{name}({ast.unparse(node.args)})` of the Python module `{module}`: {summary}"
            records.append({"conversations": [{"role": "user", "content": question},
                                              {"role": "assistant", "content": source}]})
    return records


def load_conversations(source: str) -> datasets.Dataset:
    """Records with a "conversations" column from a named source or a local .jsonl/.json file."""
    if source == "stdlib":
        return datasets.Dataset.from_list(stdlib_conversations())
    if source == "minimind":
        if not _hub_is_reachable():
            raise SourceError("SFT source 'minimind' is on the Hugging Face hub, which cannot be reached (offline); "
                              "offline alternatives: stdlib (the default) or a local conversations .jsonl")
        return datasets.load_dataset("jingyaogong/minimind_dataset", data_files="sft_mini_512.jsonl", split="train")
    path = Path(source)
    if not path.exists() or path.suffix not in (".jsonl", ".json"):
        raise SourceError(f"SFT source {source!r}: expected stdlib, minimind, or an existing .jsonl/.json file")
    check_utf8(path)
    dataset = datasets.load_dataset("json", data_files=str(path), split="train")
    if "conversations" not in dataset.column_names:
        raise SourceError(f"{path}: records have no 'conversations' field (found {dataset.column_names})")
    return dataset


@dataclass
class SFTData:
    train: list[SFTExample]
    val: list[SFTExample]
    val_conversations: list[list[dict]]
    stats: dict[str, int] = field(default_factory=dict)


def build_sft_data(source: str, tokenizer, max_tokens: int, val_fraction: float = 0.05) -> SFTData:
    """Encode every conversation; split by a hash of the first message (deterministic, per conversation)."""
    dataset = load_conversations(source)
    train, val, val_conversations = [], [], []
    stats = {"conversations": len(dataset), "truncated": 0, "dropped": 0}
    for index, record in enumerate(dataset):
        messages = check_conversation(record, f"{source}, record {index}")
        example = encode_conversation(tokenizer, messages, max_tokens)
        if example is None:
            stats["dropped"] += 1
            continue
        stats["truncated"] += int(example.truncated)
        if is_validation(messages[0]["content"], val_fraction):  # data.prepare's document-hash rule
            val.append(example)
            val_conversations.append(messages)
        else:
            train.append(example)
    if not train or not val:
        raise SourceError(f"SFT source {source!r}: {len(train)} train / {len(val)} held-out conversations fit in "
                          f"{max_tokens} tokens; need at least one of each (raise model.max_seq_len or add data)")
    stats.update(train=len(train), val=len(val))
    return SFTData(train, val, val_conversations, stats)


def pad_batch(examples: list[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded inputs and shifted targets; padding and unlabelled tokens get IGNORE_INDEX targets."""
    width = max(len(example.input_ids) for example in examples) - 1
    inputs = torch.full((len(examples), width), pad_id, dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        length = len(example.input_ids) - 1
        inputs[row, :length] = torch.tensor(example.input_ids[:-1])
        targets[row, :length] = torch.tensor(example.labels[1:])
    return inputs, targets


class SFTBatches:
    """Random conversations per step (a function of seed and step) and fixed held-out batches."""

    def __init__(self, data: SFTData, batch_size: int, seed: int, pad_id: int, val_batches: int) -> None:
        self.data = data
        self.batch_size = batch_size
        self.seed = seed
        self.pad_id = pad_id
        self.val_batches = val_batches

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step, micro_step])
        rows = rng.integers(0, len(self.data.train), size=self.batch_size)
        return pad_batch([self.data.train[row] for row in rows], self.pad_id)

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        examples = self.data.val[: self.val_batches * self.batch_size]
        for first in range(0, len(examples), self.batch_size):
            yield pad_batch(examples[first : first + self.batch_size], self.pad_id)
