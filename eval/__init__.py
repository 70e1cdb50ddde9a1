"""Measuring one checkpoint: perplexity, extrapolation and the penalty, passkey, probes, task scoring, the
inference-time methods, attention diagnostics, statistics. Nothing here trains (tests/test_layers.py): what trains
fleets of models and reports on them is experiments/."""
