"""Shared fixtures: tiny configs, cached decoding in steps, and a small prepared corpus built offline from a few stdlib
files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from data.sources import stdlib_files
from model.config import ModelConfig
from model.kv_cache import KVCache

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Hypothesis profiles, one per test tier. Each Hypothesis test names its full example count (tests/test_fuzz.py's
# fuzz(n)); a profile's max_examples caps it. "fast" (the default: `pytest -q`, `make test`) runs every property on
# FAST_EXAMPLES generated inputs each; "full" (`make test-integration` passes --hypothesis-profile=full) caps
# nothing, so each test runs its full count. Both are deterministic: no deadline, derandomized, no example database.
FAST_EXAMPLES = 25
_COMMON = dict(deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("fast", max_examples=FAST_EXAMPLES, **_COMMON)
settings.register_profile("full", max_examples=100_000, **_COMMON)
settings.load_profile("fast")  # Hypothesis' own pytest option --hypothesis-profile=NAME loads another after this
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def micro_config(**overrides) -> ModelConfig:
    """A model small enough for exact fp32 checks in milliseconds; its plug-in settings checked and completed, as a
    model's are (ModelConfig.check_plugins)."""
    values = dict(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32)
    values.update(overrides)
    return ModelConfig(**values)


def decode_in_steps(model, tokens: torch.Tensor, steps, cache=None) -> torch.Tensor:
    """The logits (batch, time, vocab) of `tokens` (batch, time) fed to `model` through a KV cache in pieces, to
    compare with a full forward: the tokens before each of `steps` (e.g. (7, 12): tokens 0-6, then 7-11), then the
    rest one at a time. `cache`: a KVCache of the tokens' length by default. Runs in the caller's grad mode."""
    batch, time = tokens.shape
    if cache is None:
        cache = KVCache.for_model(model.config, batch_size=batch, max_len=time)
    ends = [*steps, *range((steps[-1] if steps else 0) + 1, time + 1)]
    return torch.cat([model(tokens[:, start:end], kv_cache=cache)[0] for start, end in zip([0, *ends], ends)], dim=1)


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def small_text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 200 KB of Python source from this machine's stdlib, documents separated by <|endoftext|>."""
    files = [p for p in stdlib_files() if p.name in {"textwrap.py", "string.py", "shlex.py", "fnmatch.py",
                                                        "glob.py", "bisect.py", "heapq.py", "colorsys.py",
                                                        "keyword.py", "queue.py", "sched.py", "calendar.py"}]
    assert len(files) >= 8, "expected common stdlib modules on this machine"
    path = tmp_path_factory.mktemp("corpus") / "code.txt"
    path.write_text("\n<|endoftext|>\n".join(p.read_text() for p in files))
    return path


@pytest.fixture(scope="session")
def prepared_data(small_text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from data.prepare import prepare

    out = tmp_path_factory.mktemp("prepared") / "code"
    prepare(str(small_text_file), out, vocab_size=512, val_fraction=0.2, num_proc=2)
    return out


def train_micro_run(data: Path, out: Path) -> Path:
    """A 2-step, 1-layer checkpoint (L = 16) trained through the CLI on `data`: for commands that read one."""
    from train.pretrain import main as pretrain

    assert pretrain([f"--data.dir={data}", f"--out.dir={out}", "--model.vocab_size=512", "--model.dim=32",
                     "--model.n_layers=1", "--model.n_heads=2", "--model.n_kv_heads=1", "--model.max_seq_len=16",
                     "--train.max_steps=2", "--train.batch_size=2", "--train.eval_batches=1"]) == 0
    return out


class CountingKernel:
    """A compiled kernel that records each call (the shape of its first argument) before running it."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __call__(self, *args):
        self.calls.append(args[0].shape)
        return self.kernel(*args)
