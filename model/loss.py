"""The output head and the next-token loss in one pass over chunks of rows, without the (tokens x vocab) logits.

A training step needs only the loss and its gradients. The plain path materialises the logits, their float32
copy, the softmax and its gradient, each (batch x time x vocab). Here each chunk of rows computes its logits, its
loss, and at once the gradients with respect to the hidden states and the head's weight (softmax minus the one-hot
target, times the other operand); the logits are dropped before the next chunk. Backward only scales the saved
gradients. The same idea as Liger-Kernel's fused linear cross-entropy, written with plain torch ops.

Under autocast the matmuls run in the autocast dtype, as the plain path's head does; log-sum-exp, softmax and the
weight gradient's accumulation are float32.
"""
from __future__ import annotations

import torch

from data.batches import IGNORE_INDEX
from model import compiled as compiling
from model.compiled import Compiled

CHUNK_ELEMENTS = 2**22  # logits per chunk (rows x vocab): 16 MiB in float32


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        # hidden (tokens, dim); weight (vocab, dim); targets (tokens,) with IGNORE_INDEX where nothing is scored
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        exact = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64 for float64 weights
        total = torch.zeros((), dtype=exact, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=exact, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], rows):
            h, t = hidden[start : start + rows], targets[start : start + rows]
            logits = torch.matmul(h, weight.t()).to(exact)  # (rows, vocab)
            scored = t != IGNORE_INDEX
            safe = torch.where(scored, t, torch.zeros_like(t))
            log_norm = torch.logsumexp(logits, dim=-1)
            total += ((log_norm - logits.gather(1, safe[:, None]).squeeze(1)) * scored).sum()
            if want_hidden or want_weight:
                grad_logits = torch.exp(logits.sub_(log_norm[:, None]))  # softmax, in place of the logits
                grad_logits[torch.arange(len(t), device=t.device), safe] -= 1.0
                grad_logits *= scored[:, None]
                if want_hidden:
                    grad_hidden[start : start + rows] = torch.matmul(grad_logits.to(weight.dtype), weight).to(hidden.dtype)
                if want_weight:
                    grad_weight += torch.matmul(grad_logits.t().to(h.dtype), h).to(exact)
        ctx.save_for_backward(grad_hidden if want_hidden else None, grad_weight if want_weight else None)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_total.to(grad_hidden.dtype),
                None if grad_weight is None else (grad_weight * grad_total).to(ctx.weight_dtype), None, None)


def _linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          reduction: str = "mean", chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """cross_entropy(hidden @ weight.T, targets) with reduction "sum" or "mean" (over the scored targets), in
    chunks of rows; hidden (..., dim), targets (...)."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"linear_cross_entropy reduces by 'sum' or 'mean', not {reduction!r}")
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    rows = max(1, chunk_elements // weight.shape[0])
    total = _ChunkedLinearCrossEntropy.apply(flat_hidden, weight, flat_targets, rows)
    if reduction == "sum":
        return total
    return total / (flat_targets != IGNORE_INDEX).sum().clamp(min=1)


def block_scores(logits: torch.Tensor, targets: torch.Tensor, first: int,
                 exact: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of the head's logits, (rows, words first .. first + columns - 1), in at least float32 (`exact`),
    whatever the logits' dtype: each row's log-sum-exp over the block, and its target's logit where the target is
    in the block (0 elsewhere). targets (rows,), the vocabulary's indices (IGNORE_INDEX is never in a block)."""
    wide = logits.to(exact)
    local = targets - first
    inside = (local >= 0) & (local < logits.shape[1])
    picked = wide.gather(1, torch.where(inside, local, torch.zeros_like(local))[:, None]).squeeze(1)
    return torch.logsumexp(wide, dim=-1), torch.where(inside, picked, torch.zeros_like(picked))


# A block's scores compiled: one pass over its logits, read in their own dtype, instead of the eager path's float32
# copy and the log-sum-exp's four passes (about 6x faster on 64 x 262k bfloat16 logits, one core).
_COMPILED_BLOCK = Compiled(block_scores, "the head's cross-entropy", "it runs eagerly (model/loss.py)", dynamic=True)

# Rows of hidden states per block: every block of words re-reads the head's weight for its rows, so a block of few
# rows makes the weight's reading (not the matmul) the head's cost (262k x 640 in bfloat16 is 335 MB: 64-row blocks
# took 6.1 s for 4,096 rows where 1,024-row blocks took 2.9, one core of a Xeon with AMX).
HEAD_ROWS = 2048
# Logits per block (HEAD_ROWS x 1,024 words): 4 MiB in bfloat16. Blocks of 2^20 or 2^21 logits scored 4,096 rows of
# a 262k vocabulary in 2.7-2.9 s, 2^22 in 4.3 s and 2^24 in 5.2 s (bfloat16, one core of a Xeon with AMX).
HEAD_BLOCK = 2**21


@torch.no_grad()
def token_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                        chunk_elements: int = HEAD_BLOCK, compiled: bool = True) -> torch.Tensor:
    """cross_entropy(hidden @ weight.T, targets, reduction="none") in blocks, without gradients: the loss of every
    token (float32, 0 where the target is IGNORE_INDEX), shaped as targets; hidden (..., dim). What scoring a long
    window needs: a 32k-token window of a 49k vocabulary would otherwise hold 6 GB of logits.

    The head runs at the scored rows only (targets not IGNORE_INDEX): with a 262k vocabulary (Gemma 3) the head at
    every one of 64k positions would cost about half of the forward. Its logits are computed in blocks of at most
    HEAD_ROWS rows by chunk_elements / rows words, and a row's log-sum-exp gathered over its blocks of words
    (log(e^a + e^b), float32), so that the weight is read once per block of rows. compiled=False keeps each block's
    log-sum-exp eager (runtime.compiled_pointwise = false); the two agree within float rounding."""
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    exact = torch.promote_types(weight.dtype, torch.float32)
    scored_rows = (flat_targets != IGNORE_INDEX).nonzero().squeeze(1)
    if len(scored_rows) < len(flat_targets):
        losses = torch.zeros(flat_targets.shape, dtype=exact, device=hidden.device)
        losses[scored_rows] = token_cross_entropy(flat_hidden[scored_rows], weight, flat_targets[scored_rows],
                                                  chunk_elements, compiled)
        return losses.view(targets.shape)
    losses = torch.empty(flat_targets.shape, dtype=exact, device=hidden.device)
    rows = max(1, min(HEAD_ROWS, flat_hidden.shape[0]))
    columns = max(1, chunk_elements // rows)
    # Under autocast a matmul casts its operands at every call, and a transposed weight is not a cached leaf: the
    # head's (dim x vocab) weight would be cast once per block. Cast it, and the hidden states, once.
    if torch.is_autocast_enabled(hidden.device.type):
        low = torch.get_autocast_dtype(hidden.device.type)
        flat_hidden, weight = flat_hidden.to(low), weight.to(low)
    for start in range(0, flat_hidden.shape[0], rows):
        h, t = flat_hidden[start : start + rows], flat_targets[start : start + rows]
        log_norm = picked = None
        for first in range(0, weight.shape[0], columns):
            logits = torch.matmul(h, weight[first : first + columns].t())  # (rows, columns), in the matmul's dtype
            block = _COMPILED_BLOCK(logits, t, first, exact) if compiling.worth_compiling(logits, compiled) else None
            block_norm, block_picked = block if block is not None else block_scores(logits, t, first, exact)
            log_norm = block_norm if log_norm is None else torch.logaddexp(log_norm, block_norm)
            picked = block_picked if picked is None else picked + block_picked
        losses[start : start + rows] = log_norm - picked
    return losses.view(targets.shape)


# Never traced: under torch.compile (torch 2.11, CUDA) this Function's traced graph returned no gradients at all,
# so the compiled model never learned (docs/performance.md, "GPU"). A compiled model runs it eagerly (one graph break at
# the head), which kept its gradients there and keeps the (tokens x vocab) logits out of memory.
linear_cross_entropy = torch.compiler.disable(_linear_cross_entropy)
