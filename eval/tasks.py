"""Moved: the synthetic task suite is `python -m experiments.tasks` (experiments/ trains fleets of models; eval/ measures
one checkpoint). `python -m eval.tasks ...` still runs it, with a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.tasks", "experiments.tasks")
