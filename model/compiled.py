"""A function that evaluation forwards run compiled (torch.compile, on first use), with a way back: if compiling or
running the compiled code fails (no C++ compiler, say), a warning names the error, and the call returns None so the
caller runs its eager path. With remember=True (the default) every later call returns None at once; with
remember=False the caller keeps the failure itself (FlexAttention's backend, per model view: model/attention/flex.py).

Its users: FlexAttention for distance biases (model/attention/flex.py), and the pointwise passes of long forwards without
gradients on the CPU (worth_compiling): the RoPE rotation (model/rope.py), the RMS norms (model/layers.py) and the
scored head's log-sum-exp (model/loss.py), each one fused pass over its tensor instead of several eager ones."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

# Below this many elements a pointwise pass runs eagerly: its eager passes cost less than a compiled call's guards.
COMPILED_MIN_ELEMENTS = 2**20


def worth_compiling(x: torch.Tensor, compiled: bool) -> bool:
    """Whether a pointwise pass over x runs compiled: the caller allows it (`compiled`: its model's runtime switch),
    x is long, on the CPU, and neither gradients nor an enclosing compile are in play."""
    return (compiled and x.device.type == "cpu" and x.numel() >= COMPILED_MIN_ELEMENTS
            and not torch.is_grad_enabled() and not torch.compiler.is_compiling())


class Compiled:
    def __init__(self, function: Callable, what: str, instead: str, remember: bool = True, **options: Any) -> None:
        """`what` is named in the warning, followed by `instead` (what happens from then on); `options` go to
        torch.compile."""
        self.function, self.what, self.instead, self.options = function, what, instead, options
        self.remember = remember
        self.compiled: Callable | None = None
        self.failure: str | None = None  # why compiling failed, once it has (remember=True)
        self.last_failure: str | None = None  # why the latest failed call failed

    def __call__(self, *args: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            if self.compiled is None:
                self.compiled = torch.compile(self.function, **self.options)
            return self.compiled(*args)
        except Exception as error:  # noqa: BLE001 (any compiler failure: fall back, say why once)
            failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            if self.remember:
                self.failure = failure
            self.last_failure = failure
            warnings.warn(f"{self.what} could not be compiled ({failure}); {self.instead}", stacklevel=3)
            return None
