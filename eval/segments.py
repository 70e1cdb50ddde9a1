"""Which tokens an extrapolation evaluation scores, and the windows that score them.

The evaluation text is a set of segments of M tokens (M = the longest evaluation length), spread evenly over
the whole held-out stream, so a cell is not the start of one document. Every length k*L that divides M tiles
each segment with nonoverlapping windows, so all lengths (and all models sharing a tokenizer) score exactly the
same tokens. Each segment keeps `margin` tokens of text before it, so the L-window reference can give its first
tokens a full context too.

Loss arrays are in segment layout: (segments, M), column j = the target ids[start + 1 + j].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from errors import ConfigError, DataError


@dataclass(frozen=True)
class Segments:
    starts: np.ndarray  # (segments,) stream index of each segment's first input token
    length: int  # M, targets per segment

    @property
    def tokens(self) -> int:
        return len(self.starts) * self.length


def choose_segments(n_tokens: int, length: int, wanted_tokens: int, margin: int) -> Segments:
    """ceil(wanted_tokens / length) segments of `length` targets, evenly spread over a stream of n_tokens ids,
    never overlapping and each with `margin` ids before it. Fewer when the stream is too short (at least one)."""
    usable = n_tokens - 1 - margin  # targets available after the first margin
    if usable < length:
        raise DataError(
            f"the evaluation text holds {n_tokens:,} tokens, fewer than one segment of {length:,} plus "
            f"{margin:,} tokens of context; use more held-out text or shorter --lengths"
        )
    count = min(-(-wanted_tokens // length), usable // length)
    if count == 1:
        return Segments(np.array([margin], dtype=np.int64), length)
    spacing = (usable - length) / (count - 1)  # >= length, because count * length <= usable
    starts = margin + np.floor(np.arange(count) * spacing).astype(np.int64)
    return Segments(starts, length)


def tiled_windows(ids: np.ndarray, segments: Segments, window: int) -> np.ndarray:
    """Nonoverlapping windows of `window` inputs tiling each segment (a remainder shorter than a window is left
    out): int64 (segments * (M // window), window + 1)."""
    per_segment = segments.length // window
    if per_segment < 1:
        raise ConfigError(f"a window of {window} tokens is longer than the segments ({segments.length} tokens)")
    offsets = segments.starts[:, None] + window * np.arange(per_segment)[None, :]  # (segments, per_segment)
    index = offsets.reshape(-1, 1) + np.arange(window + 1)[None, :]
    return np.asarray(ids)[index].astype(np.int64)


def tiled_layout(losses: np.ndarray, segments: Segments, window: int) -> np.ndarray:
    """Losses of tiled_windows (windows, window) back in segment layout; NaN for an untiled remainder."""
    per_segment = segments.length // window
    out = np.full((len(segments.starts), segments.length), np.nan, dtype=np.float32)
    out[:, : per_segment * window] = losses.reshape(len(segments.starts), per_segment * window)
    return out


def window_positions(segments: Segments, window: int) -> np.ndarray:
    """(M,) position inside its window of each segment column when tiled by `window` (-1 for the remainder)."""
    columns = np.arange(segments.length)
    return np.where(columns < (segments.length // window) * window, columns % window, -1)


def reference_windows(ids: np.ndarray, segments: Segments, context: int, stride: int) -> np.ndarray:
    """Sliding windows of `context` inputs that advance by `stride`; each scores its last `stride` targets, so
    every segment target is predicted with between context - stride + 1 and context tokens of context, all at
    positions < context. int64 (segments * M / stride, context + 1)."""
    if segments.length % stride or not 1 <= stride <= context:
        raise ConfigError(f"the reference stride ({stride}) must divide the segment length ({segments.length}) "
                         f"and be between 1 and the context ({context})")
    if int(segments.starts.min()) < context - stride:
        raise DataError("segments need at least context - stride tokens of text before them")
    # The window that scores targets start + 1 + j*stride .. start + (j+1)*stride ends with input start + (j+1)*stride - 1.
    ends = segments.starts[:, None] + stride * np.arange(1, segments.length // stride + 1)[None, :] - 1
    index = ends.reshape(-1, 1) - context + 1 + np.arange(context + 1)[None, :]
    return np.asarray(ids)[index].astype(np.int64)


def reference_layout(losses: np.ndarray, segments: Segments, stride: int) -> np.ndarray:
    """The last `stride` losses of each reference window, in segment layout (segments, M)."""
    return losses[:, -stride:].reshape(len(segments.starts), segments.length).astype(np.float32)


def reference_in_tiling(segments: Segments, context: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference windows (reference_windows(ids, segments, context, stride)) that are windows of the tiling by
    `context` (tiled_windows(ids, segments, context)), the same inputs and targets: (their indices among the
    reference windows, their indices among the tiled ones). Every context / stride-th reference window is one."""
    per_context = context // stride
    reference_per_segment, tiled_per_segment = segments.length // stride, segments.length // context
    ends = np.arange(1, reference_per_segment + 1)  # reference window j ends after (j + 1) strides
    hit = (ends % per_context == 0) & (ends // per_context <= tiled_per_segment)
    segment = np.arange(len(segments.starts))[:, None]
    reference = (segment * reference_per_segment + (ends[hit] - 1)[None, :]).reshape(-1)
    tiled = (segment * tiled_per_segment + (ends[hit] // per_context - 1)[None, :]).reshape(-1)
    return reference, tiled
