"""experiments/compare/ as a package: its import graph has no cycle, config.py imports no other module of it, no function
takes more than 8 parameters, the compare config is typed (never `Any`), and the probe names are one list."""
from __future__ import annotations

import ast

from tests.conftest import ROOT
from tests.test_layers import cycles, graph

PACKAGE = "experiments.compare"
MAX_PARAMETERS = 8


def package_graph() -> dict[str, set[str]]:
    """module -> the modules of experiments.compare it imports (the package itself, its __init__, left out)."""
    edges, _ = graph()
    inside = {name for name in edges if name.startswith(PACKAGE + ".")}
    return {name: {target for target in edges[name] if target in inside} for name in sorted(inside)}


def test_the_package_imports_without_a_cycle_and_config_imports_none_of_it():
    edges = package_graph()
    assert {"experiments.compare.config", "experiments.compare.results", "experiments.compare.report", "experiments.compare.plots",
            "experiments.compare.probes", "experiments.compare.running", "experiments.compare.cli"} <= set(edges)
    assert not cycles(edges), cycles(edges)
    assert edges["experiments.compare.config"] == set()
    # the results object is below everything that reads it
    for reader in ("experiments.compare.report", "experiments.compare.plots", "experiments.compare.probes"):
        assert "experiments.compare.results" in edges[reader], reader
    assert "experiments.compare.report" not in edges["experiments.compare.running"]  # the jobs do not write the report


def package_functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted((ROOT / "experiments" / "compare").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.name}:{node.lineno} {node.name}", node))
    return found


def test_no_function_of_the_package_takes_a_long_parameter_list():
    assert len(package_functions()) > 50
    long = []
    for where, node in package_functions():
        arguments = node.args
        names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs if a.arg != "self"]
        if len(names) > MAX_PARAMETERS:
            long.append(f"{where}: {len(names)} parameters")
    assert not long, long


def test_the_compare_config_is_typed_everywhere():
    """A parameter named `compare` is a CompareConfig (or its dict inside a job), in the package and in
    experiments/ladder.py: never `Any` or unannotated."""
    untyped = []
    paths = [*sorted((ROOT / "experiments" / "compare").glob("*.py")), ROOT / "experiments" / "ladder.py"]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for argument in node.args.args + node.args.kwonlyargs:
                    if argument.arg == "compare" and (argument.annotation is None or
                                                      ast.unparse(argument.annotation) == "Any"):
                        untyped.append(f"{path.name}:{node.lineno} {node.name}")
    assert not untyped, untyped


def test_the_probe_names_of_the_config_are_the_probes_that_run():
    from experiments.compare.config import PROBE_NAMES
    from experiments.compare.probes import PROBES

    assert list(PROBES) == list(PROBE_NAMES)
