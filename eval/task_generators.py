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
predicted (argmax, teacher-forced); token accuracy: the share of answer targets predicted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from errors import ConfigError
from eval.inference_methods import NONE, method_spec
from model.transformer import Transformer

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
    chance: float  # the token accuracy of a predictor that ignores the context (uniform over the answer symbols)
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


# The retrieval tasks' vocabulary: keys, values, then filler (the haystack, or what lies between pairs and queries).
KEYS, VALUES, FILLER = 64, 64, 16
KEY0, VALUE0, FILLER0 = SPECIALS, SPECIALS + KEYS, SPECIALS + KEYS + VALUES
RETRIEVAL_VOCAB = FILLER0 + FILLER
MQAR_PAIRS = 4  # pairs (and queries) per sequence: at most this many, fewer in short training sequences


def _filler(rng: np.random.Generator, length: int) -> np.ndarray:
    tokens = rng.integers(FILLER0, FILLER0 + FILLER, size=length)
    tokens[0] = BOS
    return tokens


def _pairs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` distinct keys and a value each."""
    return rng.choice(KEYS, size=count, replace=False) + KEY0, rng.integers(0, VALUES, size=count) + VALUE0


def _mqar_place(rng: np.random.Generator, length: int, pairs: int, pair_start: int, query_start: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Filler, with `pairs` key-value pairs from pair_start and the same keys queried, in another order, each
    followed by its value (the answer), from query_start."""
    tokens, answers = _filler(rng, length), np.zeros(length, dtype=bool)
    keys, values = _pairs(rng, pairs)
    tokens[pair_start : pair_start + 2 * pairs : 2], tokens[pair_start + 1 : pair_start + 2 * pairs : 2] = keys, values
    order = rng.permutation(pairs)
    tokens[query_start : query_start + 2 * pairs : 2] = keys[order]
    tokens[query_start + 1 : query_start + 2 * pairs : 2] = values[order]
    answers[query_start + 1 : query_start + 2 * pairs : 2] = True
    return tokens, answers


def mqar_pairs(length: int) -> int:
    return max(1, min(MQAR_PAIRS, (length - 2) // 4))


def make_mqar(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """BOS, filler, the pairs k_1 v_1 .. k_n v_n, filler, the queries (the same keys in another order, each followed
    by its value, the answer), filler. In training the two stretches of filler have random lengths, so every
    query-to-key distance the length holds is seen; in testing (no distance set) the pairs open the sequence and the
    queries close it."""
    pairs = mqar_pairs(length)
    room = length - 1 - 4 * pairs  # filler tokens
    if train:
        before, between = sorted(rng.integers(0, room + 1, size=2))
        return _mqar_place(rng, length, pairs, 1 + before, 1 + 2 * pairs + between)
    return _mqar_place(rng, length, pairs, 1, length - 2 * pairs)


def make_mqar_at(rng: np.random.Generator, length: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """The queries close the sequence; the pairs start `distance` tokens before them (query i's key lies
    distance + 2 (i - j) before it, for the pair j it asks, |i - j| < the number of pairs)."""
    pairs = mqar_pairs(length)
    query_start = length - 2 * pairs
    return _mqar_place(rng, length, pairs, query_start - distance, query_start)


def mqar_max_distance(length: int) -> int:
    return length - 2 * mqar_pairs(length) - 1  # the pairs right after BOS


NIAH_NEEDLES = 4  # needles per haystack (fewer in short ones): the queried one and its distractors


def _niah_place(rng: np.random.Generator, length: int, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A haystack of filler with a needle (key, value) at each start, then SEP, the first needle's key, its value
    (the answer)."""
    tokens, answers = _filler(rng, length), np.zeros(length, dtype=bool)
    keys, values = _pairs(rng, len(starts))
    for start, key, value in zip(starts, keys, values):
        tokens[start], tokens[start + 1] = key, value
    tokens[length - 3], tokens[length - 2], tokens[length - 1] = SEP, keys[0], values[0]
    answers[length - 1] = True
    return tokens, answers


def _needle_starts(rng: np.random.Generator, length: int, count: int, fixed: int | None = None) -> list[int]:
    """Distinct, non-overlapping needle positions in [1, length - 5] (two tokens each), `fixed` first if given."""
    slots = np.arange(1, length - 4, 2)  # two-token slots before SEP, key, value
    if fixed is not None:
        slots = slots[np.abs(slots - fixed) >= 2]
    chosen = rng.choice(slots, size=min(count, len(slots)), replace=False).tolist()
    return ([fixed] if fixed is not None else []) + chosen


def niah_needles(length: int) -> int:
    return max(1, min(NIAH_NEEDLES, (length - 4) // 6))


def make_niah(rng: np.random.Generator, length: int, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Needles at random depths (training: every depth the haystack holds); the first is queried."""
    return _niah_place(rng, length, _needle_starts(rng, length, niah_needles(length)))


def make_niah_at(rng: np.random.Generator, length: int, distance: int) -> tuple[np.ndarray, np.ndarray]:
    """The queried needle's key lies `distance` tokens before the query key; the distractors anywhere else."""
    start = length - 2 - distance
    return _niah_place(rng, length, _needle_starts(rng, length, niah_needles(length) - 1, start))


def niah_max_distance(length: int) -> int:
    return length - 3  # the needle right after BOS


for task in (Task("copy", SPECIALS + COPY_SYMBOLS, make_copy, 1 / COPY_SYMBOLS, 2 * COPY_SYMBOLS + 3),
             Task("associative_recall", SPECIALS + RECALL_KEYS + RECALL_VALUES, make_associative_recall,
                  1 / RECALL_VALUES),
             Task("flipflop", ONE + 1, make_flipflop, 0.5),
             Task("mqar", RETRIEVAL_VOCAB, make_mqar, 1 / VALUES, make_at=make_mqar_at,
                  max_distance=mqar_max_distance, min_distance=2 * MQAR_PAIRS),
             Task("niah_multikey", RETRIEVAL_VOCAB, make_niah, 1 / VALUES, make_at=make_niah_at,
                  max_distance=niah_max_distance, min_distance=3)):
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


@torch.inference_mode()
def evaluate(model: Transformer, task: Task, length: int, count: int, seed: int | list[int] = EVAL_SEED,
             distance: int | None = None) -> dict[str, float]:
    """Exact match and token accuracy on `count` sequences of `length` from `seed` (on the model's device); with a
    `distance`, sequences whose answers lie that far before their queries (retrieval tasks)."""
    model.eval()
    batch = task.batch(seed, count, length, distance=distance)
    device = next(model.parameters()).device
    logits = torch.cat([model(batch.inputs[first : first + 64].to(device))[0].cpu() for first in range(0, count, 64)])
    return score(logits, batch)


# The answer distances of the retrieval grid, as multiples of the trained length L: one within L, the rest past it.
GRID_DISTANCES = (0.5, 2, 4, 8)


def distance_label(multiple: float) -> str:
    return "L/2" if multiple == 0.5 else f"{multiple:g}L"


def grid_cells(task: Task, trained: int, multiples: list[int]) -> list[tuple[str, str, int]]:
    """(length key "Mx", distance label, distance in tokens) for every cell of the retrieval grid: each evaluation
    length M x L and each answer distance of GRID_DISTANCES that it holds (distance <= length); a distance the
    length cannot hold exactly (the queries and the pairs take room) is the largest it holds."""
    cells = []
    for multiple in multiples:
        length = multiple * trained
        for far in GRID_DISTANCES:
            if far <= multiple:
                cells.append((f"{multiple}x", distance_label(far), min(int(far * trained), task.max_distance(length))))
    return cells


def window_control(model: Transformer, trained: int) -> Transformer:
    """The same weights with every layer's attention limited to the last `trained` keys (the `window` attention
    method). Stacked layers still reach n_layers x (trained - 1) tokens back through intermediate positions, so the
    control can retrieve past L only through such relays."""
    return model.with_settings(attention_methods=[{"method": "window", "window": trained}])


def retrieval_grid(model: Transformer, task: Task, trained: int, multiples: list[int], count: int,
                   seed: int | list[int] = EVAL_SEED, method: str = NONE) -> dict[str, dict[str, dict]]:
    """Exact match and token accuracy at every (length, answer distance) of the grid, for the model (under an
    inference-time method, set for each length: eval/inference_methods.py) and for its window control:
    {"Mx": {label: {"distance": d, "full": metrics, "window": metrics}}}."""
    spec = method_spec(method)
    grid: dict[str, dict[str, dict]] = {}
    for key, label, distance in grid_cells(task, trained, multiples):
        length = int(key[:-1]) * trained
        view = spec.view(model, length, trained)
        grid.setdefault(key, {})[label] = {
            "distance": distance,
            "full": evaluate(view, task, length, count, seed, distance),
            "window": evaluate(window_control(view, trained), task, length, count, seed, distance)}
    return grid
