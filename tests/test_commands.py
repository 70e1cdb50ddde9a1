"""The command-line convention: README's table is true of every command, --help shows defaults, old spellings
still work with a note, and lists are comma-separated everywhere."""
import importlib
import re

import pytest

from commands import comma_list, command_parser, deprecated
from tests.conftest import ROOT

COMMANDS = ["data.prepare", "train.pretrain", "train.sft", "train.extend", "eval.perplexity", "eval.extrapolation",
            "eval.passkey", "eval.attention", "eval.induction", "eval.tasks", "eval.compare", "eval.rope_analysis", "scripts.generate",
            "scripts.encoding_costs", "scripts.flex_costs", "scripts.step_profile", "scripts.export_hf",
            "scripts.import_hf", "scripts.bench", "scripts.dynamic_check"]


def readme_table() -> list[tuple[list[str], list[str]]]:
    """(flags, commands) for every row of README's command-line table."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Command line"):]
    section = section[:section.index("\n### ", 1)]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`--"):
            flags = re.findall(r"`(--[a-z-]+)", cells[0])
            rows.append((flags, comma_list(cells[2])))
    return rows


def options(module: str) -> set[str]:
    parser = importlib.import_module(module).build_parser()
    return {flag for action in parser._actions if action.help != "==SUPPRESS==" for flag in action.option_strings}


def test_every_documented_flag_exists_in_every_command_the_table_names():
    rows = readme_table()
    assert len(rows) >= 12
    named = {command for _, commands in rows for command in commands}
    assert named <= set(COMMANDS), named - set(COMMANDS)
    missing = [(flag, command) for flags, commands in rows for command in commands for flag in flags
               if flag not in options(command)]
    assert not missing, missing


def test_help_shows_defaults_and_names_the_command_as_typed():
    for module in COMMANDS:
        text = importlib.import_module(module).build_parser().format_help()
        assert text.startswith(f"usage: python -m {module}"), module
    generate = importlib.import_module("scripts.generate").build_parser().format_help()
    assert "(default: 200)" in generate and "(default: 0.8)" in generate
    assert "(default: 1x,2x,4x,8x,16x)" in importlib.import_module("eval.extrapolation").build_parser().format_help()


def test_an_old_spelling_works_and_says_what_replaces_it(capsys):
    parser = command_parser("x", None)
    parser.add_argument("--length", type=int)
    deprecated(parser, "--seq-len", "--length", "length", type=int)
    assert parser.parse_args(["--seq-len", "7"]).length == 7
    note = capsys.readouterr().err
    assert "--seq-len is deprecated" in note and "use --length" in note
    assert parser.parse_args([]).length is None and parser.parse_args(["--length", "3"]).length == 3
    assert "--seq-len" not in parser.format_help()  # hidden from --help


@pytest.mark.parametrize("command, argv, key", [
    ("train.pretrain", ["--init", "runs/x"], "checkpoint"),
    ("data.prepare", ["--source", "stdlib", "--out", "o"], "data"),
    ("eval.perplexity", ["--max-tokens", "5"], "tokens"),
    ("scripts.import_hf", ["--model", "m", "--out", "o"], "checkpoint"),
])
def test_old_spellings_of_the_commands_fill_the_new_option(command, argv, key, capsys):
    args, _ = importlib.import_module(command).build_parser().parse_known_args(argv)
    assert getattr(args, key) not in (None, False)
    assert "is deprecated" in capsys.readouterr().err


def test_lists_are_comma_separated(tmp_path):
    assert comma_list("rope, alibi,") == ["rope", "alibi"] and comma_list(["rope", "alibi,t5"]) == ["rope", "alibi", "t5"]
    from eval.compare import load_compare_config

    config = tmp_path / "c.toml"
    config.write_text("[compare]\nencodings = ['rope']\n")
    compare, _, _ = load_compare_config(config, None, ["--compare.encodings=rope,alibi", "--compare.seeds=1,2"])
    assert compare.encodings == ["rope", "alibi"] and compare.seeds == [1, 2]


def readme_commands() -> list[str]:
    """Every `python -m ...` command in README: in bash blocks and in inline code."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("python -m "):
                commands.append(line.split("  #")[0].split(" # ")[0])
    commands += [match for match in re.findall(r"`(python -m [^`]+)`", text)]
    return commands


def test_every_readme_command_parses_with_its_command_and_uses_no_old_spelling(capsys):
    import shlex

    commands = readme_commands()
    assert len(commands) >= 20
    for command in commands:
        text = re.sub(r"\[(?!--)[^\]]*\]", "", command).replace("[", "").replace("]", "")
        text = re.sub(r"(\S+)\|\S+", r"\1", text)  # "--shape tiny|small": one of the alternatives
        words: list[str] = []
        for word in shlex.split(text):  # "..." stands for a value after an option, else for more arguments
            if word != "...":
                words.append(word)
            elif words[-1].startswith("--") and "=" not in words[-1]:
                words.append("x")
        module = words[2]
        if module not in COMMANDS:
            continue
        args, unknown = importlib.import_module(module).build_parser().parse_known_args(words[3:])
        overrides_allowed = module.startswith("train.") or module in ("eval.compare", "eval.tasks")
        stray = [word for word in unknown if not (overrides_allowed and re.match(r"--\w+\.\w+=", word))]
        assert not stray, (command, stray)
        assert "deprecated" not in capsys.readouterr().err, command
