"""experiments.sink_share on hand-made diagnostics: the share per layer is averaged over the queries from the given
position on, seeds are grouped by variant, and a layer with a sink stands out of uniform attention."""
import json

import numpy as np

from experiments.sink_share import main, shares


def diagnostics(curves_by_seed: dict[str, np.ndarray]) -> dict:
    positions = np.arange(64, dtype=float)
    return {label: {"trained": 64, "lengths": {"1x": {"sink": {"positions": positions.tolist(),
                                                                "by_position": curves.tolist()}}}}
            for label, curves in curves_by_seed.items()}


def test_a_sink_layer_stands_out_of_uniform_attention(tmp_path, capsys):
    uniform = 1 / (np.arange(64) + 1)
    sink = np.where(np.arange(64) >= 16, 0.6, uniform)  # one layer puts 60% on the first token
    results = diagnostics({f"plain/seed{s}": np.stack([uniform, uniform]) for s in (1, 2, 3)} |
                          {f"sinky/seed{s}": np.stack([uniform, sink]) for s in (1, 2, 3)})
    found = shares(results, 16)
    assert sorted(found) == [("plain", "1x"), ("sinky", "1x")] and len(found[("plain", "1x")]["layers"]) == 3
    assert np.isclose(found[("plain", "1x")]["uniform"], uniform[16:].mean())
    assert np.allclose(found[("sinky", "1x")]["layers"][0], [uniform[16:].mean(), 0.6])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| sinky | 1x | 3 |" in out and "0.6000" in out  # the largest layer: the sink
    assert main([str(tmp_path / "missing.json")]) == 2
