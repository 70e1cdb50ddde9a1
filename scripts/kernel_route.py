"""Follow a command to its attention kernel: which of the project's files a setting passes through, and how often.

    python -m scripts.kernel_route -- train.pretrain --config configs/tiny.toml --model.position=alibi \
        --train.max_steps=1
    python -m scripts.kernel_route --through model/attention/merged.py -- eval.extrapolation \
        --checkpoint runs/tiny --lengths 2x --methods selfextend --out /tmp/ext

The command runs in this process under a profiler until the first call of the attention kernel (torch's
scaled_dot_product_attention, or an explicit softmax); the profiler keeps the call tree of the project's own
functions (calls into torch and other libraries are not followed, what they call back of ours is). The route is the
part of that tree that carries the setting from the command line to the kernel, in stages:

    config   building the model's config (model/config.py), its own fields and its plug-in settings
             (ModelConfig.check_plugins), with what they call
    model    building the model (Transformer.__init__) and what it calls: the encoding, the backend choice where
             a model makes it at build time
    choice   choosing the attention backends (model/attention/registry.py) and what it calls
    method   an attention method's own code (model/methods/: its record, its settings, its passes, its rules;
             not how an evaluation sets it up, EVALUATION_SETUP)
    kernel   the calls on the stack when the kernel runs

with every caller of each, up to the command's entry. Printed: each stage's call tree as files, the files of the
whole route, the hops (a call from one file into another) and each file entered again after the route left it
(A -> B -> A on one stack, from the command's main). Data loading, logging and the optimiser lie off the route unless a stage calls them.
"""
from __future__ import annotations

import argparse
import runpy
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from commands import command_parser

ROOT = Path(__file__).resolve().parents[1]
# The front file of model/methods/ also holds how an evaluation sets a method up (the Method record: the settings it
# changes for a length, which encodings it applies to): the caller's side, which no stage follows; the attention
# methods' own code (their records, settings, passes and rules) is the "method" stage.
EVALUATION_SETUP = {"view", "changes", "method_spec", "applies", "check_methods", "check_composition", "label",
                    "encodings", "as_trained", "_original", "_never"}
STAGES = {
    "config": lambda file, name: file == "model/config.py" and name in ("__post_init__", "check_plugins"),
    "model": lambda file, name: file == "model/transformer.py" and name == "__init__",
    "choice": lambda file, name: file == "model/attention/registry.py" and name in ("plan", "choose"),
    "method": lambda file, name: file.startswith("model/methods/") and not (file == "model/methods/__init__.py"
                                                                             and name in EVALUATION_SETUP),
}


def is_kernel(function: Any) -> bool:
    """torch's attention kernels (F.scaled_dot_product_attention, the CPU flash kernel that returns the log-sum-exp)
    and the explicit path's softmax."""
    name = getattr(function, "__name__", "")
    return "scaled_dot_product" in name or name == "softmax"


@dataclass
class Call:
    file: str
    name: str
    parent: Call | None
    children: list[Call] = field(default_factory=list)
    stages: set[str] = field(default_factory=set)  # the stages (of STAGES) this call starts or lies inside

    def ancestors(self) -> list[Call]:
        chain, node = [], self
        while node is not None:
            chain.append(node)
            node = node.parent
        return chain[::-1]


SKIPPED = Call("<import>", "", None)


class Stop(Exception):
    """Raised out of the command once the kernel has run."""


class Tracer:
    """A sys.setprofile hook building the project's call tree until the first kernel call."""

    def __init__(self, stages: list[str], through: str | None = None):
        self.stages = stages
        self.through = through  # the kernel counted: the first whose stack passes through this file
        self.root = Call("<command line>", "", None)
        self.frames: dict[int, Call] = {}
        self.kernel: Call | None = None
        self.files: dict[str, str | None] = {}  # code file name -> its path in the project (None: not ours)

    def project_file(self, frame: FrameType) -> str | None:
        name = frame.f_code.co_filename
        if name not in self.files:
            self.files[name] = None
            try:
                path = Path(name).resolve()
                relative = path.relative_to(ROOT)
                if path.suffix == ".py" and path != Path(__file__).resolve():
                    self.files[name] = relative.as_posix()
            except (ValueError, OSError):
                pass
        return self.files[name]

    def caller(self, frame: FrameType | None) -> Call:
        while frame is not None:
            found = self.frames.get(id(frame))
            if found is not None:
                return found
            frame = frame.f_back
        return self.root

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            file = self.project_file(frame)
            if file is None:
                return
            parent = self.caller(frame.f_back)
            if parent is SKIPPED or (frame.f_code.co_name == "<module>" and parent is not self.root):
                self.frames[id(frame)] = SKIPPED  # an import on the way (and what it runs): not a step of the route
                return
            node = Call(file, frame.f_code.co_name, parent)
            node.stages = parent.stages | {s for s in self.stages if s in STAGES and STAGES[s](file, node.name)}
            parent.children.append(node)
            self.frames[id(frame)] = node
        elif event == "return":
            self.frames.pop(id(frame), None)
        elif event == "c_call" and self.kernel is None and is_kernel(arg):
            caller = self.caller(frame)
            if self.through is not None and all(item.file != self.through for item in caller.ancestors()):
                return
            self.kernel = Call(f"torch.{arg.__name__}", "", caller)
            raise Stop  # reaches the command as an exception from the kernel call


def route_calls(tracer: Tracer) -> list[Call]:
    """The calls on the route: each stage's calls, the kernel's stack and every caller of them."""
    kept: dict[int, Call] = {}

    def walk(node: Call) -> None:
        if node.stages:
            for item in node.ancestors():
                kept[id(item)] = item
        for child in node.children:
            walk(child)

    walk(tracer.root)
    if tracer.kernel is not None and "kernel" in tracer.stages:
        for item in tracer.kernel.ancestors():
            kept[id(item)] = item
    return list(kept.values())


def summary(calls: list[Call]) -> dict[str, Any]:
    """Files, hops and re-entered files of the route."""
    kept = {id(c) for c in calls}
    files = list(dict.fromkeys(c.file for c in calls if c.parent is not None))
    hops = {(c.parent.file, c.file) for c in calls if c.parent is not None and c.parent.parent is not None
            and c.parent.file != c.file}
    again = set()
    for call in calls:
        if any(id(child) in kept for child in call.children):
            continue  # only the route's leaves: each one's stack holds its callers
        left: set[str] = set()
        previous = None
        # from the command's main: its module body only calls it (through errors.py's cli_command)
        for item in [c for c in call.ancestors()[1:] if c.name != "<module>"]:
            if previous is not None and item.file != previous:
                left.add(previous)
            if item.file in left:
                again.add(item.file)
            previous = item.file
    return {"files": [f for f in files if not f.startswith("torch.")], "hops": sorted(hops), "again": sorted(again)}


def tree_lines(calls: list[Call]) -> list[str]:
    """The route as an indented tree of files (consecutive calls within one file folded)."""
    kept = {id(c) for c in calls}
    lines: list[str] = []

    def walk(node: Call, depth: int, file: str) -> None:
        for child in node.children:
            if id(child) not in kept:
                continue
            if child.file != file:
                lines.append("  " * depth + f"{child.file} ({child.name})")
                walk(child, depth + 1, child.file)
            else:
                walk(child, depth, file)

    walk(calls[0].ancestors()[0] if calls else Call("", "", None), 0, "")
    return lines


def follow(command: list[str], stages: list[str], through: str | None = None) -> tuple[Tracer, list[Call]]:
    """Run `command` (a module and its arguments) until its first attention kernel call (through `through`)."""
    tracer = Tracer(stages, through)
    saved = sys.argv
    sys.argv = list(command)
    sys.setprofile(tracer)
    threading.setprofile(tracer)
    try:
        runpy.run_module(command[0], run_name="__main__", alter_sys=True)
    except (Stop, SystemExit):
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.argv = saved
    return tracer, route_calls(tracer)

# Upper bounds of two routes (issue 76), measured on tiny models by tests/test_kernel_route.py; docs/internals.md's
# route table is route_table() (`python -m scripts.kernel_route --table`), and the test holds it to these numbers.
ROUTE_BOUNDS = {
    "pretrain with ALiBi": {"command": "`train.pretrain --model.position=alibi --train.dtype=bfloat16` (training)",
                            "files": 14, "hops": 17},
    "extrapolation with SelfExtend": {
        "command": "`eval.extrapolation --methods selfextend` (`--through model/attention/merged.py`)",
        "files": 16, "hops": 28},
}
KERNEL_STACK_FILES = 6  # the project's files on the kernel's own stack, at most


def route_table() -> str:
    """docs/internals.md's table of the routes' bounds, from ROUTE_BOUNDS."""
    rows = ["| command | files, at most | hops, at most | entered again | the kernel's own stack, at most |",
            "|---|---:|---:|---|---:|"]
    rows += [f"| {bound['command']} | {bound['files']} | {bound['hops']} | none | {KERNEL_STACK_FILES} files |"
             for bound in ROUTE_BOUNDS.values()]
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.kernel_route", __doc__)
    parser.add_argument("--stages", default="config,model,choice,method,kernel",
                        help="comma-separated, of config, model, choice, method, kernel (default: all)")
    parser.add_argument("--through", metavar="FILE",
                        help="follow the first kernel call whose stack passes through FILE (e.g. "
                             "model/attention/merged.py: a method's kernel rather than the reference's)")
    parser.add_argument("--table", action="store_true",
                        help="print the routes' bounds as docs/internals.md's table (ROUTE_BOUNDS) and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- MODULE ARGS...: the command to follow")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.table:
        print(route_table())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in (*STAGES, "kernel")]
    if not command or unknown:
        parser.error(f"give a command after -- and stages of {', '.join([*STAGES, 'kernel'])} (unknown: {unknown})")
    tracer, calls = follow(command, stages, args.through)
    if tracer.kernel is None:
        print("the command ended without calling an attention kernel", file=sys.stderr)
        return 1
    found = summary(calls)
    print("\n".join(["", f"route of `{' '.join(command)}` to {tracer.kernel.file}:", *tree_lines(calls), "",
                     f"{len(found['files'])} files: {', '.join(found['files'])}",
                     f"{len(found['hops'])} hops between files",
                     "entered again after leaving: " + (", ".join(found["again"]) or "none")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
