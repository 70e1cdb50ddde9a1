"""Moved: RoPE's properties, measured without a checkpoint, are `python -m scripts.rope_analysis` (eval/ measures
one checkpoint). `python -m eval.rope_analysis ...` still runs it, with a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.rope_analysis", "scripts.rope_analysis")
