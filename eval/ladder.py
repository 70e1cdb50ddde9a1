"""Moved: the scale ladder is `python -m experiments.ladder` (experiments/ trains fleets of models; eval/ measures
one checkpoint). `python -m eval.ladder ...` still runs it, with a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.ladder", "experiments.ladder")
