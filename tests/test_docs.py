"""The documentation is checked: every relative link and image in README.md, CHANGELOG.md and docs/ resolves (a
file, a folder, or a heading of a markdown file), and every `python -m` command shown parses with that command's
own parser, with no unknown flag and no former spelling (a history, CHANGELOG or a report's log of the commands that
made it, may name a command that no longer exists). The checkers are tested on broken examples first."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from errors import ConfigError
from tests.conftest import ROOT

# Every entry point: a module with build_parser() that runs as `python -m MODULE` (train.cli is shared, not run), a
# study of the engine (a module that defines STUDY and runs as __main__), or a package with a __main__.py.
COMMANDS = sorted(
    [f"{path.parent.name}.{path.stem}"
     for folder in ("data", "train", "infer", "eval", "experiments", "scripts")
     for path in (ROOT / folder).glob("*.py")
     if ("def build_parser" in path.read_text() or "\nSTUDY = Study(" in path.read_text())
     and "__main__" in path.read_text()]
    + [f"{folder}.{path.parent.name}.{path.stem}"  # a package's own commands (experiments.compare.rerender)
       for folder in ("data", "train", "infer", "eval", "experiments", "scripts")
       for path in (ROOT / folder).glob("*/*.py")
       if path.stem not in ("__main__", "cli")  # a package's cli is its __main__'s
       and "def build_parser" in path.read_text() and "__main__" in path.read_text()]
    + [f"{path.parent.parent.name}.{path.parent.name}"
       for folder in ("data", "train", "infer", "eval", "experiments", "scripts")
       for path in (ROOT / folder).glob("*/__main__.py")]
)
def parser_of(command: str) -> argparse.ArgumentParser:
    """The parser of `python -m COMMAND`: the module's build_parser(), or the one its package's __main__ imports."""
    package = ROOT.joinpath(*command.split(".")) / "__main__.py"
    module = importlib.import_module(f"{command}.__main__" if package.exists() else command)
    if hasattr(module, "STUDY"):  # a study: the engine's parser of its settings
        from experiments.engine import build_parser

        return build_parser(module.STUDY)
    return module.build_parser()


def missing_extra(command: str) -> str:
    """Why COMMAND cannot load here, where it needs an optional extra that is not installed (infer.harness needs
    lm-eval), else "". The command's own message names the make target that installs the extra."""
    try:
        parser_of(command)
    except ConfigError as error:
        if "is not installed" in str(error) and "make " in str(error):
            return str(error)
        raise
    return ""
# Commands whose configs take `--section.key=value` overrides after the flags.
OVERRIDES = ("train.", "experiments.", "eval.task_score")  # commands that take --section.key=value


def doc_pages() -> list[Path]:
    """README, CHANGELOG and every markdown page under docs/ (written pages; the generated reports live in results/)."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def written_pages() -> list[Path]:
    """README and the hand-written pages of docs/ (not CHANGELOG's history, not the reports that commands write)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        anchor, n = heading_anchor(heading), 1
        while anchor in found:  # repeated headings get -1, -2, ...
            anchor, n = f"{heading_anchor(heading)}-{n}", n + 1
        found.add(anchor)
    found |= set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    return found


def link_targets(text: str) -> list[str]:
    """Targets of markdown links and images, reference definitions and HTML src/href, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)
    targets += re.findall(r"(?:src|href)=\"([^\"]+)\"", text)
    return targets


def broken_links(page: Path) -> list[str]:
    """Each relative link or image of `page` that does not resolve, with the reason."""
    broken = []
    for target in link_targets(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path_part, _, fragment = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment.lower() not in anchors(path):
            broken.append(f"{target}: no heading #{fragment} in {path.name}")
    return broken


def shown_commands(text: str) -> list[str]:
    """Every `python -m ...` command in bash blocks (continued lines joined, comments cut) and in inline code."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            for start in [m.start() for m in re.finditer(r"python3? -m ", line)][:1]:
                commands.append(re.split(r"\s+#\s", line[start:])[0].split(" && ")[0].split(" | ")[0])
    commands += re.findall(r"`(python3? -m [^`]+)`", text)
    return commands


def command_problems(command: str, history: bool = False) -> list[str]:
    """What is wrong with one shown command: unknown flags, or what its parser refuses (a former spelling). In a
    history (`history`: CHANGELOG, a report's log of the commands that made it) a command that no longer exists is
    what ran then, not a problem."""
    quoted = re.findall(r"'[^']*'", command)  # a quoted value (JSON) keeps its brackets
    text = re.sub(r"'[^']*'", "QUOTED", command)
    text = re.sub(r"\[(?!--)[^\]]*\]", "", text).replace("[", "").replace("]", "")
    for value in quoted:
        text = text.replace("QUOTED", value, 1)
    text = re.sub(r"(\S+)\|\S+", r"\1", text)  # "--shape tiny|small": one of the alternatives
    text = re.sub(r"\$\(?\{?\w+\}?\)?", "x", text)  # a shell variable stands for a value
    words: list[str] = []
    for word in shlex.split(text):  # "..." stands for a value after an option, else for more arguments
        if word != "...":
            words.append(word)
        elif words[-1].startswith("--") and "=" not in words[-1]:
            words.append("x")
    if len(words) < 3:  # `python -m ...`: the form, not a command
        return []
    module = words[2]
    if module not in COMMANDS:
        ours = module.split(".")[0] in ("data", "train", "infer", "eval", "experiments", "scripts")
        return [f"{module}: no such command"] if ours and not history else []
    if missing_extra(module):  # its parser comes with the extra (make ruler-deps)
        return []
    parser = parser_of(module)
    notes = io.StringIO()
    try:
        with contextlib.redirect_stderr(notes):
            _, unknown = parser.parse_known_args(words[3:])
    except SystemExit:  # a former spelling, or a bad value
        return [notes.getvalue().strip().splitlines()[-1]]
    allowed = module.startswith(OVERRIDES)
    return [f"unknown {word}" for word in unknown if not (allowed and re.match(r"--\w+(\.\w+)+=", word))]


def test_the_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n\n## Two words\n")
    (tmp_path / "fig.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text("# Page\n[ok](docs/here.md#two-words) ![ok](fig.png) [web](https://example.org/x) "
                    "[self](#page) `[code](nowhere.md)`\n[gone](docs/gone.md) ![gone](img/none.png) "
                    "[bad anchor](docs/here.md#three)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == ["docs/gone.md: no such file", "img/none.png: no such file",
                                  "docs/here.md#three: no heading #three in here.md"]


def test_the_command_checker_finds_an_unknown_flag_and_a_former_spelling():
    text = ("```bash\npython -m eval.perplexity --checkpoint runs/demo --data stdlib --length 256  # fine\n"
            "python -m eval.perplexity --checkpoint runs/demo --no-such-flag 3\n```\n"
            "and `python -m eval.perplexity --checkpoint runs/demo --max-tokens 5`")
    commands = shown_commands(text)
    assert len(commands) == 3
    assert command_problems(commands[0]) == []
    assert command_problems(commands[1]) == ["unknown --no-such-flag", "unknown 3"]
    assert command_problems(commands[2]) == ["python -m eval.perplexity: error: --max-tokens was renamed: use --tokens"]
    assert command_problems("python -m eval.no_such_module --x") == ["eval.no_such_module: no such command"]
    assert command_problems("python -m eval.no_such_module --x", history=True) == []  # what ran then
    assert command_problems("python -m eval.perplexity --no-such-flag 3", history=True) == ["unknown --no-such-flag",
                                                                                             "unknown 3"]
    assert command_problems("python -m train.pretrain --config c.toml --train.max_steps=3") == []


def test_the_pages_exist_and_readme_is_a_guide_not_a_notebook():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for needed in ("make demo", "make test"):
        assert needed in readme
    assert len(doc_pages()) >= 10
    dated = [page.name for page in written_pages() if re.search(r"\b20\d\d-\d\d-\d\d\b", page.read_text())]
    assert not dated, f"dated paragraphs (history goes in CHANGELOG.md): {dated}"


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_and_image_resolves(page):
    assert not broken_links(page), broken_links(page)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_command_shown_parses_with_its_command(page):
    history = page not in written_pages()
    problems = {command: command_problems(command, history) for command in shown_commands(page.read_text())}
    assert not {command: found for command, found in problems.items() if found}


def shown_figures() -> list[tuple[Path, Path]]:
    """(page, image) for every image that README and the hand-written docs pages show from a report's folder."""
    return [(page, (page.parent / target).resolve()) for page in written_pages()
            for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())
            if (page.parent / target).resolve().parent not in ((ROOT / "docs").resolve(), (ROOT / "results").resolve())]


def test_a_figure_shown_from_a_report_folder_is_one_its_command_produced():
    """README and the docs pages show a report's figure by its path in the folder its command wrote (results/ladder/,
    results/tasks/, ...), not a copy that could drift: a page of that folder names the figure, or the figure is a PNG
    that matplotlib wrote (eval/figures.py saves every figure once, as PNG) next to the command's data."""
    figures = shown_figures()
    assert len(figures) >= 8

    def produced(image: Path) -> bool:
        named = any(image.name in report.read_text() for report in image.parent.glob("*.md"))
        generated = b"Matplotlib" in image.read_bytes()[:200] and any(image.parent.glob("*.json"))
        return named or generated

    orphans = [f"{page.name}: {image.relative_to(ROOT)}" for page, image in figures if not produced(image)]
    assert not orphans, orphans


def test_every_file_a_source_file_names_exists():
    """Comments and messages that point to a file (docs/PAGE.md, tests/test_X.py, model/X.py, ...) point to one
    that exists: a moved page or module leaves no pointer to nowhere."""
    named = re.compile(r"\b((?:docs|tests|model|eval|experiments|train|infer|data|scripts|configs)/[a-z0-9_/]+\.(?:md|py|toml))\b")
    missing = []
    for path in [*ROOT.glob("*.py"), *(p for folder in ("model", "eval", "experiments", "train", "infer", "data", "scripts",
                                                        "configs", "tests") for p in (ROOT / folder).rglob("*.*")
                                       if p.suffix in (".py", ".toml"))]:
        if path.name == "test_docs.py" or "fixtures" in path.parts:
            continue
        missing += [f"{path.relative_to(ROOT)}: {name}" for name in named.findall(path.read_text())
                    if not (ROOT / name).exists()]
    assert not missing, missing


def test_the_tour_script_runs_the_commands_readme_shows():
    """scripts/tour.sh times the README tour: each `python -m` command it runs is one README shows (the flags that
    replace an earlier tour's output, --overwrite and --out.overwrite=true, aside), and README states a time and
    what each step needs first."""
    script = (ROOT / "scripts" / "tour.sh").read_text().replace("\\\n", " ")
    ran = ["python " + re.sub(r"\s+", " ", line.split('"$PYTHON" ', 1)[1]).strip() for line in script.splitlines()
           if '"$PYTHON" -m ' in line]
    readme = (ROOT / "README.md").read_text()
    shown = {re.sub(r"\s+", " ", command).strip() for command in shown_commands(readme)}

    def bare(command: str) -> str:
        return re.sub(r" --(?:out\.)?overwrite(?:=true)?(?= |$)", "", command)

    assert len(ran) >= 10
    assert [command for command in ran if bare(command) not in {bare(c) for c in shown}] == []
    tour = readme[readme.index("## The tour"):readme.index("## What the quick comparison finds")]
    steps = re.split(r"\n\*\*(?=\d\. )", tour)[1:]
    assert len(steps) == 6 and all("Needs:" in step for step in steps), [step[:40] for step in steps]
