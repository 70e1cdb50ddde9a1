"""scripts.kernel_route follows a command to its attention kernel: the route's files, hops and re-entries."""
import pytest

from scripts.kernel_route import KERNEL_STACK_FILES, ROUTE_BOUNDS, follow, route_table, summary, tree_lines


@pytest.mark.slow  # a pretraining step under a Python profiler, ~10 s
def test_the_route_of_a_training_command_reaches_the_chosen_backend(prepared_data, tmp_path):
    command = ["train.pretrain", "--data", str(prepared_data), "--out", str(tmp_path / "run"),
               "--model.position=alibi", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
               "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.max_steps=1", "--train.batch_size=2",
               "--train.eval_batches=1", "--train.warmup_steps=0",
               "--train.dtype=bfloat16"]  # pinned: under "auto" a float32 machine's evaluation may consult flex
    tracer, calls = follow(command, ["config", "model", "choice", "kernel"])
    assert tracer.kernel is not None and tracer.kernel.file == "torch.scaled_dot_product_attention"
    stack = [c.file for c in tracer.kernel.ancestors()]
    # ALiBi in training: a float mask through the masked backend, chosen once by the registry
    assert stack[-2] == "model/attention/sdpa_mask.py" and "model/attention/layer.py" in stack
    found = summary(calls)
    for needed in ("model/config.py", "model/encodings/__init__.py", "model/encodings/alibi.py", "model/attention/registry.py",
                   "model/attention/sdpa_mask.py", "train/pretrain.py"):
        assert needed in found["files"], needed
    assert "data/tokenizer.py" not in found["files"]  # off the route: no stage calls it
    assert all("<import>" not in line for line in tree_lines(calls))
    assert found["hops"] and set(found["again"]) <= set(found["files"])
    assert "train/pretrain.py" not in found["again"]  # the module body calling main is not a re-entry




def test_the_training_route_stays_within_its_bounds_and_enters_no_file_twice(prepared_data, tmp_path):
    command = ["train.pretrain", "--data", str(prepared_data), "--out", str(tmp_path / "run"),
               "--model.position=alibi", "--model.dim=32", "--model.n_layers=1", "--model.n_heads=2",
               "--model.n_kv_heads=1", "--model.max_seq_len=16", "--train.max_steps=1", "--train.batch_size=2",
               "--train.eval_batches=1", "--train.warmup_steps=0",
               "--train.dtype=bfloat16"]  # pinned: under "auto" a float32 machine's evaluation may consult flex
    tracer, calls = follow(command, ["config", "model", "choice", "method", "kernel"])
    found = summary(calls)
    bound = ROUTE_BOUNDS["pretrain with ALiBi"]
    assert len(found["files"]) <= bound["files"], found["files"]
    assert len(found["hops"]) <= bound["hops"], found["hops"]
    assert found["again"] == [], found["again"]
    stack = list(dict.fromkeys(c.file for c in tracer.kernel.ancestors()
                               if c.parent is not None and not c.file.startswith("torch.")))
    assert len(stack) <= KERNEL_STACK_FILES, stack


def test_the_selfextend_evaluation_route_stays_within_its_bounds_and_enters_no_file_twice(tmp_path, prepared_data):
    from tests.conftest import train_micro_run

    checkpoint = train_micro_run(prepared_data, tmp_path / "ckpt")
    command = ["eval.extrapolation", "--checkpoint", str(checkpoint), "--lengths", "2x", "--methods", "selfextend",
               "--out", str(tmp_path / "ext")]
    tracer, calls = follow(command, ["config", "model", "choice", "method", "kernel"], through="model/attention/merged.py")
    assert tracer.kernel is not None
    found = summary(calls)
    bound = ROUTE_BOUNDS["extrapolation with SelfExtend"]
    assert "model/methods/selfextend.py" in found["files"] and "model/attention/merged.py" in found["files"]
    assert len(found["files"]) <= bound["files"], found["files"]
    assert len(found["hops"]) <= bound["hops"], found["hops"]
    assert found["again"] == [], found["again"]


def test_the_internals_route_table_is_the_bounds_table():
    """docs/internals.md's route table is route_table(), made from ROUTE_BOUNDS (the bounds the tests above hold)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "internals.md").read_text()
    assert route_table() in text, "paste `python -m scripts.kernel_route --table` into docs/internals.md"
    # and the bounds stay within issue 76's targets: ALiBi's training route 14 files and 20 hops, SelfExtend's 16 and 28
    assert ROUTE_BOUNDS["pretrain with ALiBi"]["files"] <= 14 and ROUTE_BOUNDS["pretrain with ALiBi"]["hops"] <= 20
    assert (ROUTE_BOUNDS["extrapolation with SelfExtend"]["files"] <= 16
            and ROUTE_BOUNDS["extrapolation with SelfExtend"]["hops"] <= 28)
