"""The speed and memory measurements behind docs/performance.md that are experiments, not user tools, and what every
speed measurement shares (scripts.bench and scripts.encoding_costs, the user's tools, import it from here).

    measure.py          the benchmark shapes, our and transformers' training steps on random tokens, the timers and
                        the peak memory
    attention_paths.py  python -m scripts.performance.attention_paths: the attention backend every encoding takes
                        in training, 16x evaluation and cached decoding (docs/internals.md, "Attention backends")
    flex_costs.py       python -m scripts.performance.flex_costs: FlexAttention against the chunked attention in
                        one layer (docs/performance.md, "Long forwards through FlexAttention")
    step_profile.py     python -m scripts.performance.step_profile: a training step's time by kind of work, ours
                        against transformers' (docs/performance.md, "Where a step's time goes")
"""
