"""Moved: the synthetic tasks are data/tasks.py (the training data of experiments.tasks and the test sequences of
eval/), and a model's score on one is eval/task_score.py (evaluate, score). Their names stay importable here for one
release."""
from data.tasks import EVAL_SEED, TASKS, Task, TaskBatch, get_task
from eval.task_score import evaluate, score

__all__ = ["EVAL_SEED", "TASKS", "Task", "TaskBatch", "evaluate", "get_task", "score"]
