"""Length-generalisation tasks: synthetic sequences a tiny model learns in minutes at lengths <= L, then is tested
on at 1x..8x L. Registered by name; each generates its data deterministically from a seed and marks which targets
are answers (the loss and the score use only those).

    copy                 BOS s_1..s_k SEP s_1..s_k: repeat a string of distinct symbols (Kazemnejad et al. 2023);
                         k random up to the sequence's room in training, the longest it holds in testing
    associative_recall   k_1 v_1 ... k_n v_n SEP q_1 a_1 ... : for each queried key, its value (Zoology's MQAR;
                         not learned at eval.tasks' default budget, so not in its default suite)
    flipflop             pairs (w|r|i, bit): after each r, the bit of the last w (Liu et al. 2023, flip-flop)

Sequences are token ids of the task's own small vocabulary; a sequence of `length` tokens gives inputs [:-1] and
targets [1:], and `answers` marks the targets that are scored. Exact match of a sequence: every answer target
predicted (argmax, teacher-forced); token accuracy: the share of answer targets predicted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from errors import ConfigError

BOS, SEP = 0, 1
SPECIALS = 2


@dataclass(frozen=True)
class TaskBatch:
    inputs: torch.Tensor  # (n, length - 1) int64
    targets: torch.Tensor  # (n, length - 1) int64
    answers: torch.Tensor  # (n, length - 1) bool: targets that are scored


@dataclass(frozen=True)
class Task:
    name: str
    vocab_size: int
    # (rng, length, train) -> (tokens, answer-token mask); `train` draws the training distribution (e.g. copy's
    # strings of every length up to the sequence's), else the test one (the longest string the length holds)
    make: Callable[[np.random.Generator, int, bool], tuple[np.ndarray, np.ndarray]]
    chance: float  # the token accuracy of a predictor that ignores the context (uniform over the answer symbols)
    max_length: int | None = None  # the longest sequence the task can generate, if bounded

    def batch(self, seed: int | list[int], count: int, length: int, train: bool = False) -> TaskBatch:
        """`count` sequences of `length` tokens, a function of (seed, count, length, train) only (seed may be a
        list, e.g. [seed, step] for training batches)."""
        if length < 4:
            raise ConfigError(f"task {self.name}: sequences need at least 4 tokens, got {length}")
        if self.max_length is not None and length > self.max_length:
            raise ConfigError(f"task {self.name}: sequences of at most {self.max_length} tokens, got {length}; "
                              f"use a shorter --length or fewer --multiples")
        rng = np.random.default_rng([*(seed if isinstance(seed, list) else [seed]), length])
        rows, marks = zip(*(self.make(rng, length, train) for _ in range(count)))
        tokens, answer_tokens = np.stack(rows), np.stack(marks)
        return TaskBatch(torch.from_numpy(tokens[:, :-1]).long(), torch.from_numpy(tokens[:, 1:]).long(),
                         torch.from_numpy(answer_tokens[:, 1:]))


TASKS: dict[str, Task] = {}

COPY_SYMBOLS = 256


def make_copy(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """BOS s SEP s, then SEP padding: a string of distinct symbols, of a random length up to half the sequence in
    training (so no fixed offset solves it) and of the longest length the sequence holds in testing. Distinct
    symbols make the copy a lookup (the symbol after the current one's first occurrence: an induction head)."""
    half = (length - 2) // 2
    size = int(rng.integers(1, half + 1)) if train else half
    string = rng.choice(COPY_SYMBOLS, size=size, replace=False) + SPECIALS
    tokens = np.full(length, SEP, dtype=np.int64)  # the padding after the copy is SEP, not scored
    tokens[0] = BOS
    tokens[1 : 1 + size] = string
    tokens[1 + size] = SEP
    tokens[2 + size : 2 + 2 * size] = string
    answers = np.zeros(length, dtype=bool)
    answers[2 + size : 2 + 2 * size] = True
    return tokens, answers


RECALL_KEYS, RECALL_VALUES = 24, 24


def make_associative_recall(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """n key-value pairs (distinct keys), SEP, then queries of n of the keys (with repeats) each followed by its
    value: 2n + 1 + 2q tokens with q = n, padded with SEP."""
    pairs = min(RECALL_KEYS, max(1, (length - 2) // 4))
    keys = rng.choice(RECALL_KEYS, size=pairs, replace=False) + SPECIALS
    values = rng.integers(0, RECALL_VALUES, size=pairs) + SPECIALS + RECALL_KEYS
    queries = max(1, (length - 2 - 2 * pairs) // 2)
    asked = rng.integers(0, pairs, size=queries)
    tokens = np.full(length, SEP, dtype=np.int64)
    answers = np.zeros(length, dtype=bool)
    tokens[0] = BOS
    tokens[1 : 1 + 2 * pairs : 2] = keys
    tokens[2 : 2 + 2 * pairs : 2] = values
    start = 2 + 2 * pairs  # tokens[1 + 2 * pairs] is SEP
    for index, which in enumerate(asked):
        at = start + 2 * index
        if at + 1 >= length:
            break
        tokens[at], tokens[at + 1] = keys[which], values[which]
        answers[at + 1] = True
    return tokens, answers


WRITE, READ, IGNORE, ZERO, ONE = 2, 3, 4, 5, 6


def make_flipflop(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """BOS, then (instruction, bit) pairs: the first is a write; w writes, i is noise, r must repeat the last
    written bit (the answer). Instructions: w with p = 0.1, r with p = 0.2, else i (flip-flop language's sparse
    setting, FFL(0.8))."""
    pairs = (length - 1) // 2
    tokens = np.full(length, IGNORE, dtype=np.int64)
    answers = np.zeros(length, dtype=bool)
    tokens[0] = BOS
    memory = 0
    for index in range(pairs):
        draw = rng.random()
        instruction = WRITE if index == 0 or draw < 0.1 else READ if draw < 0.3 else IGNORE
        bit = int(rng.integers(0, 2)) if instruction != READ else memory
        if instruction == WRITE:
            memory = bit
        at = 1 + 2 * index
        tokens[at], tokens[at + 1] = instruction, ZERO + bit
        answers[at + 1] = instruction == READ
    if length % 2 == 0:
        tokens[-1] = IGNORE
    return tokens, answers


for task in (Task("copy", SPECIALS + COPY_SYMBOLS, make_copy, 1 / COPY_SYMBOLS, 2 * COPY_SYMBOLS + 3),
             Task("associative_recall", SPECIALS + RECALL_KEYS + RECALL_VALUES, make_associative_recall,
                  1 / RECALL_VALUES),
             Task("flipflop", ONE + 1, make_flipflop, 0.5)):
    TASKS[task.name] = task


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid names are {sorted(TASKS)}")
    return TASKS[name]


@torch.inference_mode()
def score(logits: torch.Tensor, batch: TaskBatch) -> dict[str, float]:
    """Exact match (every answer of a sequence right) and token accuracy over the answers, from teacher-forced
    logits (n, length - 1, vocab)."""
    right = (logits.argmax(-1) == batch.targets) | ~batch.answers
    answered = batch.answers.sum()
    token_accuracy = float(((logits.argmax(-1) == batch.targets) & batch.answers).sum() / answered.clamp(min=1))
    return {"exact_match": float(right.all(dim=1).float().mean()), "token_accuracy": token_accuracy}
