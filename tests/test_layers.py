"""The import graph, parsed from the source: layers import one way and no module imports itself in a circle.

Layers, bottom first (docs/internals.md): errors and commands, data, model, then train and infer side by side, eval,
experiments, scripts. A module may import its own package and the layers below it, at the top of the file: an import
inside a function (the usual way to dodge a cycle) of another project package is refused too, with one exception: a
command's `main` (in a module run as `python -m`) may import after the statement that parses its arguments, so that a
mistyped flag is refused before torch loads; and a module that needs an optional extra (OPTIONAL: infer.harness needs
lm-eval) is imported inside the function that uses it, so that its importers load without the extra. Those imports
obey the ranks like any other. Imports under
`if TYPE_CHECKING:` are annotations only and do not count. Besides the ranks, eval/ never trains: it measures one
checkpoint and imports nothing from train/ (an experiment, which trains fleets of models, composes the two).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

OPTIONAL = {"infer.harness"}  # modules that need an optional extra to load (make ruler-deps)
RANK = {"errors": 0, "commands": 0, "data": 1, "model": 2, "train": 3, "infer": 3, "eval": 4, "experiments": 5,
        "scripts": 6}
# Imports the ranks allow but the layering forbids: (layer, layer it may not import, why).
FORBIDDEN = [("eval", "train", "eval/ measures one checkpoint and never trains; code that trains models and "
                               "evaluates them belongs in experiments/")]


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the project, those of packages inside the layers (experiments.compare) too."""
    modules = {"errors": ROOT / "errors.py", "commands": ROOT / "commands.py"}
    for package in RANK:
        folder = ROOT / package
        if folder.is_dir():
            for path in sorted(folder.rglob("*.py")):
                parts = path.relative_to(ROOT).with_suffix("").parts
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


PARSE_CALLS = {"parse", "parse_args", "parse_known_args"}  # what parses a command's arguments (commands.parse, ...)


def parsed_by(main: ast.FunctionDef) -> int | None:
    """The last line of `main`'s first statement that parses the command line (calls one of PARSE_CALLS), or None."""
    for statement in main.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                function = node.func
                name = getattr(function, "id", None) or getattr(function, "attr", None)
                if name in PARSE_CALLS:
                    return statement.end_lineno
    return None


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, inside a function) for every runtime import of a project module; an import in
    a command's `main` after its arguments are parsed counts as not inside a function."""
    found: list[tuple[str, int, bool]] = []
    tree = ast.parse(path.read_text())
    command = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)

    def visit(node: ast.AST, in_function: bool, parsed: int | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module] + [f"{child.module}.{alias.name}" for alias in child.names]
            lazy = in_function and parsed is not None and getattr(child, "lineno", 0) > parsed
            for name in names:
                if name.split(".")[0] in RANK:
                    found.append((name, child.lineno, in_function and not lazy))
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                main = command and node is tree and isinstance(child, ast.FunctionDef) and child.name == "main"
                visit(child, True, parsed_by(child) if main else None)
            else:
                visit(child, in_function, parsed)

    visit(tree, False, None)
    return found


def graph(modules: dict[str, Path] | None = None) -> tuple[dict[str, set[str]], list[str]]:
    modules = modules or project_modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    problems: list[str] = []
    for name, path in modules.items():
        layer = name.split(".")[0]
        for imported, line, in_function in imports(path):
            target = imported if imported in modules else imported.rsplit(".", 1)[0]
            if target not in modules or target == name:
                continue
            edges[name].add(target)
            other = target.split(".")[0]
            where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line} imports {target}"
            if other != layer and RANK[other] >= RANK[layer]:
                problems.append(f"{where}: {layer} (rank {RANK[layer]}) may not import {other} (rank {RANK[other]})")
            problems += [f"{where}: {why}" for low, high, why in FORBIDDEN if (layer, other) == (low, high)]
            if in_function and other != layer and target not in OPTIONAL:
                problems.append(f"{where} inside a function: import it at the top of the file")
    return edges, sorted(set(problems))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def walk(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                walk(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return found


def test_eval_never_trains(tmp_path):
    """No module of eval/ imports train/; a planted import is caught and named."""
    modules = project_modules()
    assert not [name for name, targets in graph(modules)[0].items()
                if name.startswith("eval") and any(target.startswith("train") for target in targets)]
    planted = tmp_path / "planted.py"
    planted.write_text("from train.loop import run_training\n")
    _, problems = graph({**modules, "eval.planted": planted})
    assert [problem for problem in problems if "planted.py" in problem and "never trains" in problem], problems


# eval/ measures one checkpoint; grids, fleets and their statistics live in experiments/. (3,000 until the use probe
# gained its jittered places, its priming control, the calibrated verdicts of one report's family of cells and its
# --report-only; 3,300 until eval.use's own probe gained the priming control's third forward and presence and order;
# 4,700 until the one verdict rule carried the margin's error and the exact tests every study shares: Clopper-Pearson,
# McNemar, the Poisson-binomial tail, and the true-null forwards.)
EVAL_LINES = 4750


def test_eval_stays_the_measurement_of_one_checkpoint():
    """eval/ holds at most EVAL_LINES lines: when it outgrows them, what it gained is usually an experiment (a grid
    of cells, a report) or a model capability (a view of the model), which belong in experiments/ or model/. It
    holds, besides the measurement of one checkpoint, what eval/ and the studies share: the one statistics module
    (intervals over windows and over the seeds of a fleet), the one use module and the verdict rules (eval/verdicts.py)."""
    lines = sum(len(path.read_text().splitlines()) for path in (ROOT / "eval").rglob("*.py"))
    assert lines <= EVAL_LINES, f"eval/ has {lines:,} lines (at most {EVAL_LINES:,}); see this test's docstring"


def test_layers_import_one_way():
    edges, problems = graph()
    assert len(edges) > 40  # the parser sees the project
    assert not problems, "\n".join(problems)


def test_the_import_graph_has_no_cycles():
    edges, _ = graph()
    assert not cycles(edges), cycles(edges)


def test_the_checker_catches_what_it_forbids(tmp_path):
    """The checks can fail: an upward import, one inside a function and a cycle are each reported."""
    source = tmp_path / "m.py"
    source.write_text("from eval.perplexity import main\n\ndef f():\n    from data import sources\n"
                      "if TYPE_CHECKING:\n    from scripts.generate import main\n")
    assert imports(source) == [("eval.perplexity", 1, False), ("eval.perplexity.main", 1, False),
                               ("data", 4, True), ("data.sources", 4, True)]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_command_may_import_in_main_after_parsing_and_nowhere_else(tmp_path):
    """The one exception to "at the top of the file": a command's main, after the statement that parses its
    arguments. An import there still obeys the ranks; one before the parse, in another function, in a function
    nested in main, or in a `main` of a module that is not a command is refused."""
    modules = project_modules()
    command = tmp_path / "command.py"
    command.write_text(
        "from commands import parse\n\n"
        "def main(argv=None):\n"
        "    from data import sources\n"  # line 4: before the parse
        "    args = parse(build_parser(), argv)\n"
        "    from model.checkpoint import load_model\n"  # line 6: after it, a lower layer: allowed
        "    from experiments.jobs import run\n"  # line 7: after it, but upward
        "    def inner():\n        from model import rope\n"  # line 9: nested function
        "    return 0\n\n"
        "def helper():\n    from model import config\n\n"  # line 13: another function
        "if __name__ == '__main__':\n    main()\n")
    assert [(name, line, inside) for name, line, inside in imports(command) if name.count(".") < 2] == [
        ("commands", 1, False), ("commands.parse", 1, False), ("data", 4, True), ("data.sources", 4, True),
        ("model.checkpoint", 6, False), ("experiments.jobs", 7, False), ("model", 9, True), ("model.rope", 9, True),
        ("model", 13, True), ("model.config", 13, True)]
    _, problems = graph({**modules, "eval.command": command})
    mine = [problem for problem in problems if "command.py" in problem]

    def refused(line: int, why: str) -> bool:
        return any(f"command.py:{line} imports" in problem and why in problem for problem in mine)

    assert refused(4, "inside a function") and refused(9, "inside a function") and refused(13, "inside a function")
    assert refused(7, "may not import experiments") and not refused(6, ""), mine
    library = tmp_path / "library.py"  # the same main in a module that is not a command
    library.write_text(command.read_text().split("if __name__")[0])
    _, problems = graph({**modules, "eval.library": library})
    assert any("library.py:6 imports model.checkpoint inside a function" in problem for problem in problems), problems


def project_sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in project_modules().items()}


def test_each_plug_in_kind_is_one_registry_whose_every_key_is_defined_in_one_file_of_its_package():
    """Three kinds, three registries (issue 76): POSITION_ENCODINGS (model/encodings/), BACKENDS
    (model/attention/registry.py) and METHODS (model/methods/). Each key is defined in exactly one file of its package
    (the file of the class or function that computes it), each item's file defines one key (rope and xpos share
    rotary.py), and the tables by kind (ROPE_SCALINGS, ATTENTION_METHODS) are views of METHODS, not registries."""
    from model.attention.registry import BACKEND_MODULES, BACKENDS
    from model.encodings import ENCODING_MODULES, POSITION_ENCODINGS
    from model.methods import ATTENTION_METHODS, METHOD_MODULES, METHODS, NONE, ROPE_SCALINGS

    def module_of(method) -> str:
        if method.scaling is not None:
            return method.scaling.function.__module__
        if method.attention is not None:
            return method.attention.__module__
        return method.changes.__module__

    tables = {"model.encodings": ({name: cls.__module__ for name, cls in POSITION_ENCODINGS.items()}, ENCODING_MODULES),
              "model.attention": ({name: cls.__module__ for name, cls in BACKENDS.items()}, BACKEND_MODULES),
              "model.methods": ({name: module_of(method) for name, method in METHODS.items()}, METHOD_MODULES)}
    sources = project_sources()
    for package, (defined, modules) in tables.items():
        assert defined, package
        files = {f"{package}.{module}" for module in modules}
        for name, module in defined.items():
            assert module in files or (package, name) == ("model.methods", NONE), (package, name, module)
            assert f'"{name}"' in sources[module], (package, name, module)  # named where it is defined
        per_file = {}
        for name, module in defined.items():
            per_file.setdefault(module, []).append(name)
        shared = {module: names for module, names in per_file.items() if len(names) > 1}
        assert shared == ({"model.encodings.rotary": ["rope", "xpos"]} if package == "model.encodings" else {}), shared
    assert ROPE_SCALINGS == {"default": ROPE_SCALINGS["default"],
                             **{name: m.scaling for name, m in METHODS.items() if m.scaling is not None}}
    assert ATTENTION_METHODS == {name: m.attention for name, m in METHODS.items() if m.attention is not None}
    registries = [module for module, text in sources.items() if module.startswith("model")
                  and any(f"{table}: dict[str, " in text and f"{table}[" in text
                          for table in ("POSITION_ENCODINGS", "BACKENDS", "METHODS", "ROPE_SCALINGS", "ATTENTION_METHODS"))]
    assert sorted(registries) == ["model.attention.registry", "model.encodings", "model.methods"], registries


def test_the_rope_scalings_reach_the_command_line_and_the_methods_from_the_registry():
    from infer.rope_args import add_rope_scaling_args
    from model.methods import METHODS, ROPE_SCALINGS

    assert set(ROPE_SCALINGS) >= {"default", "linear", "ntk", "dynamic", "yarn", "llama3"}
    assert set(ROPE_SCALINGS) - {"default"} <= set(METHODS)
    import argparse

    parser = argparse.ArgumentParser()
    add_rope_scaling_args(parser)
    choices = next(action.choices for action in parser._actions if "--rope-scaling" in action.option_strings)
    assert set(choices) == (set(ROPE_SCALINGS) - {"default"}) | {"none"}


def test_a_checkpoints_data_folder_is_found_through_one_function():
    """Only model.checkpoint reads where a checkpoint's data folder is (the record, or the run's data.dir); every
    command that defaults to it calls model.checkpoint.training_data_dir."""
    readers = [module for module, text in project_sources().items()
               if '"data_folder"' in text or '.get("data", {}).get("dir"' in text]
    assert readers == ["model.checkpoint"], readers


def test_model_has_at_most_16_top_level_files():
    """model/ keeps its top level small (issue 76: at most 16 files); the plug-in kinds are packages."""
    top = sorted(path.name for path in (ROOT / "model").glob("*.py"))
    assert len(top) <= 16, top


def test_the_trained_length_is_read_through_one_accessor():
    """Only model.checkpoint.trained_length reads trainer_state["trained_seq_len"]; the trainer and import_hf
    write it."""
    readers = [module for module, text in project_sources().items() if '"trained_seq_len"' in text]
    assert sorted(readers) == ["model.checkpoint", "scripts.import_hf", "train.loop"], readers


def test_no_environment_variable_chooses_a_numeric_path():
    """Switches of how the model computes are config keys ([runtime], model/runtime.py), saved with each run; the
    environment is read only for what it is the standard place of: torchrun's ranks, the hub's offline and mirror
    settings, trackers' and tokenizers' own variables."""
    allowed = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "WANDB_MODE", "WANDB_SILENT", "WANDB_PROJECT", "HF_HUB_OFFLINE",
               "HF_DATASETS_OFFLINE", "TOKENIZERS_PARALLELISM"}
    reads = {}
    for module, text in project_sources().items():
        if module.startswith("tests"):
            continue
        names = set(re.findall(r"os\.environ(?:\.get|\.setdefault)?\(\s*\"?([A-Za-z_]+)", text))
        names |= set(re.findall(r"os\.environ\[\"([A-Za-z_]+)\"\]", text))
        names |= set(re.findall(r"os\.getenv\(\s*\"([A-Za-z_]+)", text))
        if names - allowed - {"HUB_MIRROR_ENV"}:
            reads[module] = sorted(names - allowed - {"HUB_MIRROR_ENV"})
    assert not reads, reads
    switches = {module: re.findall(r"PELAB_\w+", text) for module, text in project_sources().items()}
    assert {name for found in switches.values() for name in found} <= {"PELAB_HUB_MIRROR"}, switches
