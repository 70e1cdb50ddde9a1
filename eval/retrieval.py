"""Retrieval past the trained length: a retrieval task's exact match on a grid of input length x answer distance,
for a model and for its window control (the same weights with attention limited to the last L keys). The difference
says whether the model uses what lies past L, where the text penalty can only say it is not harmed by it."""
from __future__ import annotations

from eval.inference_methods import NONE, method_spec
from eval.task_generators import EVAL_SEED, Task, evaluate
from model.transformer import Transformer

# The answer distances of the retrieval grid, as multiples of the trained length L: one within L, the rest past it.
GRID_DISTANCES = (0.5, 2, 4, 8)


def distance_label(multiple: float) -> str:
    return "L/2" if multiple == 0.5 else f"{multiple:g}L"


def grid_cells(task: Task, trained: int, multiples: list[int]) -> list[tuple[str, str, int]]:
    """(length key "Mx", distance label, distance in tokens) for every cell of the retrieval grid: each evaluation
    length M x L and each answer distance of GRID_DISTANCES that it holds (distance <= length); a distance the
    length cannot hold exactly (the queries and the pairs take room) is the largest it holds."""
    cells = []
    for multiple in multiples:
        length = multiple * trained
        for far in GRID_DISTANCES:
            if far <= multiple:
                cells.append((f"{multiple}x", distance_label(far), min(int(far * trained), task.max_distance(length))))
    return cells


def window_control(model: Transformer, trained: int) -> Transformer:
    """The same weights with every layer's attention limited to the last `trained` keys: the first token (where a
    model parks attention that has nowhere to go: a sink) and the `trained` - 1 keys before each query (the `window`
    attention method with first = 1). Stacked layers still reach n_layers x (trained - 1) tokens back through
    intermediate positions, so the control can retrieve past L only through such relays."""
    return model.with_settings(attention_methods=[{"method": "window", "window": trained - 1, "first": 1}])


def retrieval_grid(model: Transformer, task: Task, trained: int, multiples: list[int], count: int,
                   seed: int | list[int] = EVAL_SEED, method: str = NONE) -> dict[str, dict[str, dict]]:
    """Exact match and token accuracy at every (length, answer distance) of the grid, for the model (under an
    inference-time method, set for each length: eval/inference_methods.py) and for its window control:
    {"Mx": {label: {"distance": d, "full": metrics, "window": metrics}}}."""
    spec = method_spec(method)
    grid: dict[str, dict[str, dict]] = {}
    for key, label, distance in grid_cells(task, trained, multiples):
        length = int(key[:-1]) * trained
        view = spec.view(model, length, trained)
        grid.setdefault(key, {})[label] = {
            "distance": distance,
            "full": evaluate(view, task, length, count, seed, distance),
            "window": evaluate(window_control(view, trained), task, length, count, seed, distance)}
    return grid
