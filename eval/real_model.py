"""Moved: the grid of long-context methods on a pretrained model is `python -m experiments.real_model` (experiments/
runs grids of cells with a cache; eval/ measures one checkpoint). `python -m eval.real_model ...` still runs it, with
a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.real_model", "experiments.real_model")
