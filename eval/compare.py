"""Moved: the comparison of position encodings is `python -m experiments.compare` (experiments/ trains fleets of models; eval/ measures
one checkpoint). `python -m eval.compare ...` still runs it, with a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.compare", "experiments.compare")
