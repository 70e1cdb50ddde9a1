"""The compiled RoPE rotation (model/rope.py) that long evaluation forwards without gradients take, above all
dynamic NTK's decoding steps, against the eager rotation; its fall-back; and the allocator setting that models turn
on (model/runtime.py); the choice is the model's, taken when it is built."""
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from eval.scoring import score_incremental
from model import Transformer, rope
from model import compiled as compiling
from model.compiled import Compiled
from model.runtime import RuntimeConfig, keep_freed_memory
from tests.conftest import CountingKernel, micro_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def compiled_calls(monkeypatch):
    """Every rotation without gradients takes the compiled kernel (not only long ones); counts its calls."""
    calls = []
    monkeypatch.setattr(compiling, "COMPILED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(rope, "_COMPILED", {layout: CountingKernel(kernel, calls) for layout, kernel in rope._COMPILED.items()})
    return calls


def eager(x, cos, sin, layout):
    return rope.apply_rope(x, cos, sin, layout, compiled=False)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_the_compiled_rotation_equals_the_eager_one(layout, compiled_calls):
    torch.manual_seed(0)
    cos, sin = torch.randn(2, 1, 1, 300, 16)
    for shape in ((2, 4, 300, 16), (3, 2, 300, 16)):  # a second shape reuses the dynamic-shape kernel
        x = torch.randn(shape) * 10
        with torch.inference_mode():
            fast = rope.apply_rope(x, cos, sin, layout)
        assert (fast - eager(x, cos, sin, layout)).abs().max() < 1e-5
    assert len(compiled_calls) == 2
    # a slice of a larger buffer, as a KV cache hands its keys over
    buffer = torch.randn(2, 4, 400, 16)
    with torch.no_grad():
        assert (rope.apply_rope(buffer[:, :, :300], cos, sin, layout) -
                eager(buffer[:, :, :300], cos, sin, layout)).abs().max() < 1e-5
    # the wrong layout's eager result differs: the comparison can fail
    other = "interleaved" if layout == "half" else "half"
    assert (fast - eager(x, cos, sin, other)).abs().max() > 1e-2


def test_rotations_with_gradients_stay_eager(compiled_calls):
    x = torch.randn(2, 4, 300, 16, requires_grad=True)
    cos, sin = torch.randn(2, 1, 1, 300, 16)
    rope.apply_rope(x, cos, sin, "half").sum().backward()
    assert not compiled_calls and x.grad is not None


def test_dynamic_ntk_decoding_with_the_compiled_rotation_scores_as_the_eager_one(compiled_calls):
    torch.manual_seed(0)
    config = micro_config(init_std=0.2, position="rope", max_seq_len=8, n_layers=2,
                          rope_scaling={"rope_type": "dynamic", "factor": 1.0})
    model = Transformer(config).eval()
    windows = np.random.default_rng(0).integers(0, 97, (3, 33))
    fast = score_incremental(model, windows, prefill=8)
    assert len(compiled_calls) > 2 * 25  # every decoding step rotated its queries and all cached keys compiled
    eager_model = Transformer(config, runtime=RuntimeConfig(compiled_rope=False)).eval()
    eager_model.load_state_dict(model.state_dict())
    calls = len(compiled_calls)
    slow = score_incremental(eager_model, windows, prefill=8)
    assert len(compiled_calls) == calls  # runtime.compiled_rope = false: nothing compiled
    assert np.abs(fast - slow).max() < 1e-5


def test_a_model_takes_compiled_rope_when_it_is_built_and_keeps_it(compiled_calls):
    """The choice is the model's runtime, given when it is built (the defaults when none is given), and reaches every
    encoding that rotates (an encoding's own RoPE too), views included; no forward reads a process-wide setting."""
    from model.encodings import PositionEncoding

    def choices(model):
        return {module.compiled_rope for module in model.modules() if isinstance(module, PositionEncoding)}

    eager_model = Transformer(micro_config(position="ssmax", position_args={"ssmax": {"base": "rope"}}),
                              RuntimeConfig(compiled_rope=False)).eval()
    assert choices(eager_model) == {False} and len(list(eager_model.position.modules())) > 1
    assert choices(eager_model.with_settings(attention_methods=[{"method": "logn"}])) == {False}
    assert choices(Transformer(micro_config(position="ssmax"))) == {True}
    with torch.no_grad():
        eager_model(torch.randint(0, 97, (1, 12)))
    assert not compiled_calls


def test_a_compiler_failure_warns_once_and_rotates_eagerly(monkeypatch):
    monkeypatch.setattr(compiling, "COMPILED_MIN_ELEMENTS", 1)
    kernel = Compiled(rope._rotate_halves, "RoPE's rotation", "rotations run eagerly")
    monkeypatch.setattr(rope, "_COMPILED", {"half": kernel, "interleaved": kernel})

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(torch, "compile", no_compiler)
    x, cos, sin = torch.randn(3, 2, 1, 50, 16)
    with torch.inference_mode():
        with pytest.warns(UserWarning, match="RoPE's rotation could not be compiled .*No working C"):
            first = rope.apply_rope(x, cos, sin, "half")
        assert kernel.failure is not None
        with warnings.catch_warnings(record=True) as later:
            warnings.simplefilter("always")
            second = rope.apply_rope(x, cos, sin, "half")
    assert not later  # warned once
    assert torch.equal(first, eager(x, cos, sin, "half")) and torch.equal(second, first)


FAULTS = """
import resource, sys, torch
from model import Transformer
from model.runtime import RuntimeConfig, configure_runtime
from tests.conftest import CountingKernel, micro_config
configure_runtime(RuntimeConfig(keep_freed_memory=sys.argv[1] == "true"))
Transformer(micro_config())
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 << 20)  # 64 MiB, above glibc's largest default mmap threshold
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


@pytest.mark.skipif(not keep_freed_memory(), reason="glibc's mallopt is not available here")
def test_a_process_with_a_model_reuses_the_memory_of_freed_tensors():
    """Once the heap has settled, a 64 MiB tensor of a process that built a model takes no fresh pages; with the
    setting off, every one faults in its 16,384 pages again. (The fifth tensor is measured: the first always
    faults, and in some processes so does the second or third, when small allocations made meanwhile, e.g. by the
    thread pool's start, split the freed block; measured 12 processes: from the third on, none faulted again.)"""
    def page_faults(setting):
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
        result = subprocess.run([sys.executable, "-c", FAULTS, setting], cwd=ROOT, env=env, capture_output=True, text=True,
                                check=True)
        return int(result.stdout.split()[-1])

    assert page_faults("true") < 1000  # runtime.keep_freed_memory, the default
    assert page_faults("false") > 16000
