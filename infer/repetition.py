"""Controls against repetition: they change the next-token logits before temperature, top-k and top-p (the order
transformers applies its logits processors and warpers in), so greedy decoding is affected too.

  repetition penalty P   (CTRL, Keskar et al. 2019; transformers' RepetitionPenaltyLogitsProcessor) every token id
                         already in the context (prompt and generated tokens) has its logit divided by P when
                         positive, multiplied by P otherwise. 1 = off; above 1 discourages repeats.
  no-repeat n-gram N     (transformers' NoRepeatNGramLogitsProcessor) a token that would complete an N-gram already
                         in the context is banned (logit -inf). 0 = off.

Both take the context as (batch, time) ids and the logits as (batch, vocab) and are tested equal to transformers'.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from errors import ConfigError

# (context ids (batch, time), next-token logits (batch, vocab)) -> processed logits (batch, vocab)
LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_repetition_penalty(penalty: float) -> float:
    if not (isinstance(penalty, (int, float)) and math.isfinite(penalty) and penalty > 0):
        raise ConfigError(f"--repetition-penalty must be a positive number (1 = off, above 1 discourages repeated "
                          f"tokens, e.g. 1.2), got {penalty}")
    return float(penalty)


def check_no_repeat_ngram(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ConfigError(f"--no-repeat-ngram must be a whole number >= 0 (0 = off, N bans repeating any N tokens "
                          f"in a row, e.g. 4), got {size}")
    return size


def repetition_penalty(context: torch.Tensor, logits: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide the positive logits of the tokens in `context` by `penalty` and multiply the negative ones by it."""
    picked = logits.gather(1, context)  # (batch, time)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return logits.scatter(1, context, picked)


def ban_repeated_ngrams(context: torch.Tensor, logits: torch.Tensor, size: int) -> torch.Tensor:
    """Set to -inf the logit of every token that would complete an n-gram (n = size) already in `context`: the
    last token of each earlier n-gram whose first n - 1 tokens equal the context's last n - 1."""
    length = context.shape[1]
    if length < size:
        return logits
    suffix = context[:, length + 1 - size :]  # (batch, size - 1)
    ngrams = context.unfold(1, size, 1)  # (batch, length - size + 1, size)
    matches = (ngrams[..., :-1] == suffix.unsqueeze(1)).all(dim=-1)  # (batch, length - size + 1)
    vocab = logits.shape[-1]
    banned = torch.zeros((logits.shape[0], vocab + 1), dtype=torch.bool, device=logits.device)
    # An n-gram that does not match marks the spare column past the vocabulary, so it can unban nothing.
    banned.scatter_(1, torch.where(matches, ngrams[..., -1], vocab), True)
    return logits.masked_fill(banned[:, :vocab], float("-inf"))


def repetition_processors(penalty: float = 1.0, no_repeat_ngram: int = 0) -> list[LogitsProcessor]:
    """The processors to apply, in transformers' order (the penalty, then the n-gram ban); none when both are off.
    Bad values raise ConfigError naming the flag."""
    penalty = check_repetition_penalty(penalty)
    size = check_no_repeat_ngram(no_repeat_ngram)
    processors: list[LogitsProcessor] = []
    if penalty != 1.0:
        processors.append(lambda context, logits: repetition_penalty(context, logits, penalty))
    if size > 0:
        processors.append(lambda context, logits: ban_repeated_ngrams(context, logits, size))
    return processors
