"""Steps whose loss is not finite are never applied; the policy says whether training goes on.

"skip" with a fused optimizer: the bad step is skipped on the device (AdamW's `found_inf`, as
torch.amp.GradScaler uses it: no update, no step count) and reported at the next log, evaluation or save, so
the hot loop never waits for the device. Otherwise (policy "stop", or an unfused optimizer) the loss is read on
the host every step and a bad step is dropped before the optimizer runs.
"""
from __future__ import annotations

from typing import Callable

import torch

from errors import CommandStopped


class NonFiniteLoss(FloatingPointError, CommandStopped):
    """Training stopped on a non-finite loss; the last good checkpoint in out.dir was kept."""

    exit_code = 3


def skips_on_device(policy: str, optimizer: torch.optim.Optimizer) -> bool:
    return policy == "skip" and bool(optimizer.defaults.get("fused"))


class NonFiniteGuard:
    def __init__(self, policy: str, max_skips: int, optimizer: torch.optim.Optimizer, device: torch.device,
                 skipped_before: int, report: Callable[[dict, str], None], out: str) -> None:
        self.policy = policy
        self.max_skips = max_skips
        self.optimizer = optimizer
        self.report = report  # (metrics record, message) -> None
        self.out = out
        self.skipped = skipped_before  # reported so far, this run and the runs it resumes
        self.on_device = skips_on_device(policy, optimizer)
        self.bad_steps = torch.full((), skipped_before, dtype=torch.long, device=device)
        self.last_bad_step = torch.zeros((), dtype=torch.long, device=device)
        self.last_bad_loss = torch.zeros((), device=device)

    def admit(self, step: int, loss: torch.Tensor) -> torch.Tensor | None:
        """Before the optimizer step `step` (counted from 1) with this mean loss: the tensor flag (1 = finite) to
        weight the logged loss by, or None when the step was dropped on the host."""
        finite = torch.isfinite(loss)
        if self.on_device:
            self.optimizer.found_inf = (~finite).float()  # fused AdamW then leaves weights and state untouched
            self.bad_steps += (~finite).long()
            self.last_bad_step = torch.where(finite, self.last_bad_step, step)
            self.last_bad_loss = torch.where(finite, self.last_bad_loss, loss.detach())
            return finite
        if not bool(finite):  # one scalar read per step
            self.record(1, step, float(loss))
            return None
        return finite

    def reconcile(self) -> None:
        """Report the steps skipped on the device since the last call (reads the device once)."""
        if self.on_device:
            new = int(self.bad_steps) - self.skipped
            if new > 0:
                self.record(new, int(self.last_bad_step), float(self.last_bad_loss))

    def record(self, count: int, step: int, loss: float) -> None:
        self.skipped += count
        message = f"step {step}: non-finite loss {loss}" if count == 1 else \
            f"{count} steps up to step {step} had a non-finite loss (the last: {loss})"
        if self.policy == "stop" or self.skipped > self.max_skips:
            why = "train.nonfinite = stop" if self.policy == "stop" else f"more than {self.max_skips} skipped"
            self.report({"step": step, "nonfinite_loss": loss, "action": "stop"}, "")
            raise NonFiniteLoss(f"{message}: stopping ({why}); the last good checkpoint in {self.out} is kept, "
                                "--resume continues from it (lower train.lr or raise train.grad_clip)")
        self.report({"step": step, "nonfinite_loss": loss, "action": "skip", "count": count},
                    f"{message}: skipped ({self.skipped} of at most {self.max_skips}, train.nonfinite = skip)")
