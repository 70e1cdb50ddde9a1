"""Renamed: the attention diagnostics are `python -m eval.attention_diagnostics`. `python -m eval.attention ...` still
runs them, with a note, for one release."""
from commands import moved

if __name__ == "__main__":
    moved("eval.attention", "eval.attention_diagnostics")
