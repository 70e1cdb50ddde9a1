"""The comparison's use probe: how many windows each length gets."""
from experiments.compare.config import CompareConfig
from experiments.compare.use import probe_windows


def test_the_positive_control_reads_as_many_tokens_as_the_longest_windows():
    compare = CompareConfig(lengths=["1x", "4x", "16x"], use_windows=32)
    # 32 windows of 1,025 tokens hold 32,800 tokens: 504 windows of 65
    assert probe_windows(compare, 64, 10**6) == {64: 504, 1024: 32}
    # as many as the held-out text holds, and never fewer than compare.use_windows
    assert probe_windows(compare, 64, 65 * 100) == {64: 100, 1024: 32}
    assert probe_windows(compare, 64, 65 * 10) == {64: 32, 1024: 32}
