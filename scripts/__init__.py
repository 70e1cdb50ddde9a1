"""The user's tools, each run from the repository root as `python -m scripts.NAME` (tour.sh with bash):

    generate.py          text and chat from a checkpoint
    bench.py             speed and memory against transformers' Llama of the same shape and weights
    encoding_costs.py    each encoding's training and evaluation speed and peak memory
    export_hf.py         a checkpoint to a transformers Llama folder; import_hf.py from one, or from a GGUF file
    rope_analysis.py     RoPE's properties measured, without a checkpoint (docs/how_rope_works.md)
    kernel_route.py      the files a command's setting passes through to its attention kernel
    interval_ranges.py   intervals in the committed reports that leave the range of their quantity
    requirements_met.py  whether requirements.txt is installed (`make install` runs pip only when not)
    tour.sh              the README tour, each step timed

Experiments are in experiments/.
"""
