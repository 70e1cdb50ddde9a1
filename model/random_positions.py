"""Randomized positions (Ruoss et al., ACL 2023): each sequence's position ids are a sorted random subset of
[0, N), N = model.random_positions much larger than the trained length L, so that training already shows the
encoding the position values of sequences up to N tokens long.

As in the reference (google-deepmind/randomized_positional_encodings), positions are drawn at every forward, in
training and in evaluation alike: the model only ever sees sampled positions. In training they come from torch's
global CPU generator (seeded by train.seed, saved with each checkpoint, so a resumed training draws what an
uninterrupted one would); in evaluation each row's subset is a function of the row's tokens (a generator seeded by
a hash of them), so scores are repeatable and a batch scores each row as it would alone. Here each row draws its own subset (the reference draws one per batch).

With a KV cache the positions of the whole cache are drawn when its first tokens arrive (one subset of its max_len
per row, from the prompt's tokens), and every step takes the next of them: a cached decoding equals the full
forward given the same positions.
"""
from __future__ import annotations

import hashlib

import torch

from errors import PositionRangeError


def sorted_subset(count: int, limit: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """`count` distinct integers of [0, limit), each subset equally likely, ascending; (count,) long."""
    if count > limit:
        raise PositionRangeError(f"model.random_positions draws positions from [0, {limit}), which holds fewer than "
                                 f"the {count} this sequence needs; evaluate at <= {limit} tokens, or train a model "
                                 "with a larger model.random_positions")
    keys = torch.rand(limit, generator=generator)  # on the CPU: its global state is what a checkpoint saves
    return keys.topk(count, largest=False).indices.sort().values.to(device)


def row_generator(tokens: torch.Tensor, draw: int = 0) -> torch.Generator:
    """A CPU generator seeded by a hash of one row's token ids (and of `draw`, model.random_positions_draw): the same
    tokens and draw, the same positions."""
    data = tokens.detach().to("cpu", torch.int64).numpy().tobytes()
    digest = hashlib.blake2b(data, digest_size=8, salt=draw.to_bytes(8, "little") if draw else b"").digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def sample_positions(idx: torch.Tensor, count: int, limit: int, training: bool, draw: int = 0) -> torch.Tensor:
    """Positions (batch, count) for the rows of idx (batch, time): a sorted random subset of [0, limit) per row,
    from the global generator in training, from each row's tokens (and the evaluation's `draw`) otherwise."""
    rows = [sorted_subset(count, limit, None if training else row_generator(row, draw), idx.device) for row in idx]
    return torch.stack(rows)
