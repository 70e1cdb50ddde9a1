"""A function that evaluation forwards run compiled (torch.compile, on first use), with a way back: if compiling or
running the compiled code fails (no C++ compiler, say), a warning names the error once, the call returns None so
the caller runs its eager path, and every later call returns None at once.

Its users: FlexAttention for distance biases (model/flex.py) and the RoPE rotation of long tensors without
gradients (model/rope.py)."""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch


class Compiled:
    def __init__(self, function: Callable, what: str, instead: str, **options: Any) -> None:
        """`what` is named in the warning, followed by `instead` (what happens from then on); `options` go to
        torch.compile."""
        self.function, self.what, self.instead, self.options = function, what, instead, options
        self.compiled: Callable | None = None
        self.failure: str | None = None  # why compiling failed, once it has

    def __call__(self, *args: Any) -> Any:
        if self.failure is not None:
            return None
        try:
            if self.compiled is None:
                self.compiled = torch.compile(self.function, **self.options)
            return self.compiled(*args)
        except Exception as error:  # noqa: BLE001 (any compiler failure: fall back, say why once)
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            warnings.warn(f"{self.what} could not be compiled ({self.failure}); {self.instead}", stacklevel=3)
            return None
