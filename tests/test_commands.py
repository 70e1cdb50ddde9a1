"""The command-line convention: the guide's flags table (docs/guide/commands.md) is true of every command, --help
shows defaults, former spellings are refused naming the new one, and lists are comma-separated everywhere. Every command shown
in README and docs is checked against its parser by tests/test_docs.py."""
import importlib
import math
import re

import pytest

from commands import comma_list, command_parser, renamed
from tests.conftest import ROOT
from tests.test_docs import COMMANDS, missing_extra, parser_of


def flags_table() -> list[tuple[list[str], list[str]]]:
    """(flags, commands) for every row of the flags table in docs/guide/commands.md (under the heading that names
    the command line)."""
    text = (ROOT / "docs" / "guide" / "commands.md").read_text()
    start = re.search(r"^#+ .*Command line.*$", text, re.M | re.I)
    section = text[start.end():]
    following = re.search(r"^#+ ", section, re.M)
    section = section[:following.start()] if following else section
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`--"):
            flags = re.findall(r"`(--[a-z-]+)", cells[0])
            rows.append((flags, comma_list(cells[2])))
    return rows


def options(module: str) -> set[str]:
    parser = parser_of(module)
    return {flag for action in parser._actions if action.help != "==SUPPRESS==" for flag in action.option_strings}


def test_every_documented_flag_exists_in_every_command_the_table_names():
    rows = flags_table()
    assert len(rows) >= 12
    named = {command for _, commands in rows for command in commands}
    assert named <= set(COMMANDS), named - set(COMMANDS)
    missing = [(flag, command) for flags, commands in rows for command in commands for flag in flags
               if flag not in options(command)]
    assert not missing, missing


@pytest.mark.parametrize("module", COMMANDS)
def test_help_names_the_command_as_typed_and_only_the_png_of_a_figure(module):
    """--help starts with the command as a user types it; eval/figures.py writes each figure once, as PNG, so no
    command's --help promises an .svg beside it."""
    if reason := missing_extra(module):
        pytest.skip(reason)
    text = parser_of(module).format_help()
    assert text.startswith(f"usage: python -m {module}")
    assert ".svg" not in text


def test_help_shows_defaults():
    generate = importlib.import_module("scripts.generate").build_parser().format_help()
    assert "(default: 200)" in generate and "(default: 0.8)" in generate
    assert "(default: 1x,2x,4x,8x,16x)" in importlib.import_module("eval.extrapolation").build_parser().format_help()


def test_a_former_spelling_is_refused_with_the_name_that_replaced_it(capsys):
    parser = command_parser("x", None)
    parser.add_argument("--length", type=int)
    renamed(parser, "--seq-len", "--length")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--seq-len", "7"])
    assert stop.value.code == 2 and "--seq-len was renamed: use --length" in capsys.readouterr().err
    assert parser.parse_args([]).length is None and parser.parse_args(["--length", "3"]).length == 3
    assert "--seq-len" not in parser.format_help()  # hidden from --help


@pytest.mark.parametrize("command, argv, new", [
    ("train.pretrain", ["--init", "runs/x"], "--checkpoint"),
    ("data.prepare", ["--source", "stdlib", "--out", "o"], "--data"),
    ("eval.perplexity", ["--max-tokens", "5"], "--tokens"),
    ("scripts.import_hf", ["--model", "m", "--out", "o"], "--checkpoint"),
    ("train.extend", ["--steps", "5"], "--train.max_steps=N"),
])
def test_former_spellings_of_the_commands_name_the_new_option(command, argv, new, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module(command).build_parser().parse_known_args(argv)
    assert f"{argv[0]} was renamed: use {new}" in capsys.readouterr().err


def test_lists_are_comma_separated(tmp_path):
    assert comma_list("rope, alibi,") == ["rope", "alibi"] and comma_list(["rope", "alibi,t5"]) == ["rope", "alibi", "t5"]
    from tests.test_compare import settings_of

    config = tmp_path / "c.toml"
    config.write_text("[compare]\nencodings = ['rope']\n")
    compare = settings_of("--config", str(config), "--compare.encodings=rope,alibi", "--compare.seeds=1,2")
    assert compare.encodings == ["rope", "alibi"] and compare.seeds == [1, 2]


def test_the_commands_that_draw_figures_name_their_png_in_their_help():
    figures = [module for module in COMMANDS if not missing_extra(module) and ".png" in parser_of(module).format_help()]
    assert len(figures) >= 6, figures


def test_results_files_keep_each_record_on_one_line_and_every_float32_exactly():
    """commands.results_json: the innermost records on one line each, nested ones indented, floats to 9 significant
    digits, which read back every float32 exactly (FLT_DECIMAL_DIG); json reads the file back."""
    import json

    import numpy as np

    from commands import results_json

    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    record = {"cells": [{"label": "rope", "ppl": {"mean": 1 / 3, "low": None, "n": 3}, "per_seed": [0.1, 2.0]},
                        {"label": "alibi", "grid": [[1, 2], [3]], "empty": {}}],
              "losses": [float(v) for v in values], "bad": float("nan"), "flag": True,
              "by_seed": {1: {"rows": [{"a": 1}]}, None: {"rows": []}}}
    text = results_json(record)
    lines = text.splitlines()
    assert ' "bad": NaN,' in lines and ' "flag": true,' in lines and text.endswith("}\n")
    assert '   "ppl": {"mean": 0.333333333, "low": null, "n": 3},' in lines  # a record inside a record: its own line
    assert '   "grid": [[1, 2], [3]],' in lines and '   "empty": {}' in lines
    back = json.loads(text)
    assert np.array_equal(np.asarray(back["losses"], dtype=np.float32), values)  # float32 round-trips exactly
    assert back["cells"][0]["ppl"]["mean"] == 0.333333333 and back["cells"][1]["grid"] == [[1, 2], [3]]
    assert math.isnan(back["bad"])
    assert back["by_seed"] == json.loads(json.dumps(record["by_seed"]))  # keys as json writes them: "1", "null"


def test_a_logged_command_names_no_path_of_the_machine_that_ran_it():
    from commands import portable_command

    inside = ROOT / "docs" / "x.txt"
    shown = portable_command(f"python -m eval.use --data /srv/shared/books/war_and_peace.txt --out {inside} "
                             "--distances 0.25x,2x --checkpoint runs/smollm2")
    assert shown == ("python -m eval.use --data path/to/war_and_peace.txt --out docs/x.txt --distances 0.25x,2x "
                     "--checkpoint runs/smollm2")
    assert portable_command("--book=/tmp/a/b.txt,/tmp/c.txt") == "--book=path/to/b.txt,path/to/c.txt"
