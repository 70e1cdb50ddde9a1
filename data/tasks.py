"""Length-generalisation tasks: synthetic sequences a tiny model learns in minutes at lengths <= L, then is tested
on at 1x..8x L. Registered by name; each generates its data deterministically from a seed and marks which targets
are answers (the loss and the score use only those).

    copy                 BOS s_1..s_k SEP s_1..s_k: repeat a string of distinct symbols (Kazemnejad et al. 2023);
                         k random up to the sequence's room in training, the longest it holds in testing
    associative_recall   k_1 v_1 ... k_n v_n SEP q_1 a_1 ... : for each queried key, its value (Zoology's MQAR;
                         not learned at experiments.tasks' default budget, so not in its default suite)
    flipflop             pairs (w|r|i, bit): after each r, the bit of the last w (Liu et al. 2023, flip-flop)
    mqar                 multi-query associative recall with filler between the pairs and the queries (Arora et al.
                         2023, Zoology), the query-to-key distance set at test time
    niah_multikey        needles "key value" in a haystack of filler, then a query key: its value (RULER's
                         multi-key needle, Hsieh et al. 2024), the queried needle's distance set at test time

The retrieval tasks (mqar, niah_multikey) take a `distance` at test time: how far before the queries their answers
lie, so that retrieving past the trained length L is told apart from coping with a long input whose answer is near.

Sequences are token ids of the task's own small vocabulary; a sequence of `length` tokens gives inputs [:-1] and
targets [1:], and `answers` marks the targets that are scored. Exact match of a sequence: every answer target
predicted (argmax, teacher-forced); token accuracy: the share of answer targets predicted (a model's, on a task:
eval/task_score.py evaluate). The training data of experiments.tasks and the test sequences of eval/, so here, below
the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from errors import ConfigError

BOS, SEP = 0, 1
EVAL_SEED = 10**6  # evaluation sequences: a seed no training batch uses
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
    chance: float  # the token accuracy of a predictor that reads only the current token (uniform over the answers
    # that can follow it: a retrieval query's key has VALUES needles)
    max_length: int | None = None  # the longest sequence the task can generate, if bounded
    # (rng, length, distance) -> (tokens, answer-token mask): a test sequence whose answers lie `distance` tokens
    # before their queries (retrieval tasks); max_distance(length): the largest distance a length holds
    make_at: Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]] | None = None
    max_distance: Callable[[int], int] | None = None
    min_distance: int = 1  # the shortest distance a test sequence holds (mqar: its pairs end before its queries)

    def batch(self, seed: int | list[int], count: int, length: int, train: bool = False,
              distance: int | None = None) -> TaskBatch:
        """`count` sequences of `length` tokens, a function of (seed, count, length, train, distance) only (seed
        may be a list, e.g. [seed, step] for training batches); `distance`: test sequences whose answers lie that
        far before their queries (retrieval tasks only)."""
        if length < 4:
            raise ConfigError(f"task {self.name}: sequences need at least 4 tokens, got {length}")
        if self.max_length is not None and length > self.max_length:
            raise ConfigError(f"task {self.name}: sequences of at most {self.max_length} tokens, got {length}; "
                              f"use a shorter --length or fewer --multiples")
        if distance is not None:
            if self.make_at is None:
                raise ConfigError(f"task {self.name} has no answer distance to set; the retrieval tasks do "
                                  f"({', '.join(name for name, task in TASKS.items() if task.make_at)})")
            if not self.min_distance <= distance <= self.max_distance(length):
                raise ConfigError(f"task {self.name}: a distance of {distance} does not fit {length} tokens (from "
                                  f"{self.min_distance} to {self.max_distance(length)})")
        rng = np.random.default_rng([*(seed if isinstance(seed, list) else [seed]), length, *(
            [] if distance is None else [distance])])
        make = (lambda: self.make(rng, length, train)) if distance is None else \
            (lambda: self.make_at(rng, length, distance))
        rows, marks = zip(*(make() for _ in range(count)))
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


# The retrieval tasks' tokens. A needle is one token that carries a key (its category) and a value (which member
# of the category it is): KEYS x VALUES needle tokens, KEYS query tokens (one asks for each key), then filler (the
# haystack, or what lies between the needles and the queries). A query's answer is the needle token of its key: a
# lookup by content alone. (With key and value as two tokens, "k v", the lookup needs a previous-token binding that
# neither this model nor a plain 2-layer transformer learned within 15,000 steps: docs/evaluation.md.)
KEYS, VALUES, FILLER = 16, 16, 16
NEEDLE0 = SPECIALS
QUERY0 = NEEDLE0 + KEYS * VALUES
FILLER0 = QUERY0 + KEYS
RETRIEVAL_VOCAB = FILLER0 + FILLER
NEEDLES = 4  # needles (and queries) per sequence: at most this many, fewer in short sequences


def _filler(rng: np.random.Generator, length: int) -> np.ndarray:
    tokens = rng.integers(FILLER0, FILLER0 + FILLER, size=length)
    tokens[0] = BOS
    return tokens


def _needles(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` needles of distinct keys: (their query tokens, their needle tokens)."""
    keys, values = rng.choice(KEYS, size=count, replace=False), rng.integers(0, VALUES, size=count)
    return QUERY0 + keys, NEEDLE0 + keys * VALUES + values


def _place(rng: np.random.Generator, length: int, slots: list[int] | np.ndarray, query_start: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """Filler with a needle at each slot and, from query_start, the needles' queries in another order, each followed
    by its needle (the answer)."""
    tokens, answers = _filler(rng, length), np.zeros(length, dtype=bool)
    queries, needles = _needles(rng, len(slots))
    tokens[np.asarray(slots)] = needles
    order = rng.permutation(len(slots))
    count = len(slots)
    tokens[query_start : query_start + 2 * count : 2] = queries[order]
    tokens[query_start + 1 : query_start + 2 * count : 2] = needles[order]
    answers[query_start + 1 : query_start + 2 * count : 2] = True
    return tokens, answers


def needle_count(length: int) -> int:
    return max(1, min(NEEDLES, (length - 2) // 4))


def make_mqar(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """BOS, filler, the needles in a block, filler, the queries (the block's keys in another order, each followed
    by its needle, the answer), filler. In training the two stretches of filler have random lengths, so every
    query-to-needle distance the length holds is seen; in testing (no distance set) the block opens the sequence
    and the queries close it."""
    count = needle_count(length)
    room = length - 1 - 3 * count  # filler tokens
    if train:
        before, between = sorted(rng.integers(0, room + 1, size=2))
        return _place(rng, length, np.arange(count) + 1 + before, 1 + count + between)
    return _place(rng, length, np.arange(count) + 1, length - 2 * count)


def make_mqar_at(rng: np.random.Generator, length: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """The queries close the sequence; the block of needles starts `distance` tokens before them (query i asks for
    needle j, which lies distance + 2i - j before it)."""
    count = needle_count(length)
    query_start = length - 2 * count
    return _place(rng, length, np.arange(count) + query_start - distance, query_start)


def mqar_max_distance(length: int) -> int:
    return length - 2 * needle_count(length) - 1  # the block right after BOS


def make_niah(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """A haystack of filler with needles at random depths (every depth the haystack holds), then SEP and a query for
    every needle, in another order, each followed by its needle (RULER's multi-key needle, with every key asked)."""
    count = needle_count(length)
    query_start = length - 2 * count
    return _place(rng, length, rng.choice(np.arange(1, query_start - 1), size=count, replace=False), query_start)


def make_niah_at(rng: np.random.Generator, length: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """The needles at random depths within a band of twice their number tokens whose nearest end lies `distance`
    tokens before the first query (so every answer lies from `distance` to `distance` + 4 x needles - 3 back)."""
    count = needle_count(length)
    query_start = length - 2 * count
    band = np.arange(query_start - distance - 2 * count + 1, query_start - distance + 1)
    return _place(rng, length, rng.choice(band, size=count, replace=False), query_start)


def niah_max_distance(length: int) -> int:
    return length - 4 * needle_count(length)  # the band right after BOS


for task in (Task("copy", SPECIALS + COPY_SYMBOLS, make_copy, 1 / COPY_SYMBOLS, 2 * COPY_SYMBOLS + 3),
             Task("associative_recall", SPECIALS + RECALL_KEYS + RECALL_VALUES, make_associative_recall,
                  1 / RECALL_VALUES),
             Task("flipflop", ONE + 1, make_flipflop, 0.5),
             Task("mqar", RETRIEVAL_VOCAB, make_mqar, 1 / VALUES, make_at=make_mqar_at,
                  max_distance=mqar_max_distance, min_distance=NEEDLES),
             Task("niah_multikey", RETRIEVAL_VOCAB, make_niah, 1 / VALUES, make_at=make_niah_at,
                  max_distance=niah_max_distance, min_distance=1)):
    TASKS[task.name] = task


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; valid names are {sorted(TASKS)}")
    return TASKS[name]
