"""`make install` (which `make demo` and `make test` run first) is quiet when nothing needs installing and runs pip
when something does: the Makefile's recipe, run in a copy of the repository's files with a stand-in for python that
records each pip call instead of making it."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def run_install(folder, requirements: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make install` in `folder` (the Makefile and scripts/requirements_met.py copied in, `requirements` as
    requirements.txt), with PYTHON a script that logs `-m pip ...` and runs anything else with this interpreter."""
    (folder / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "Makefile", folder / "Makefile")
    shutil.copy(ROOT / "scripts" / "requirements_met.py", folder / "scripts" / "requirements_met.py")
    (folder / "requirements.txt").write_text(requirements)
    log = folder / "pip.log"
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$@" >> {log}; exit 0; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    # As from a shell: under `make test` the variables of the outer make would make this one a sub-make, which
    # names its directory ("make[1]: Entering directory ...")
    env = {key: value for key, value in os.environ.items() if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(["make", "install", f"PYTHON={python}"], cwd=folder, capture_output=True, text=True,
                          timeout=120, env=env)
    return done, log.read_text().splitlines() if log.exists() else []


def test_make_install_prints_nothing_and_runs_no_pip_when_everything_is_installed(tmp_path):
    done, pip_calls = run_install(tmp_path, (ROOT / "requirements.txt").read_text())
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).strip() == "" and pip_calls == []
    assert (tmp_path / ".installed").exists()


def test_make_install_runs_pip_for_what_is_missing(tmp_path):
    done, pip_calls = run_install(tmp_path, "numpy>=1\nno-such-package-pelab-test>=1\n")
    assert done.returncode == 0, done.stderr
    assert "to install: no-such-package-pelab-test>=1 (not installed)" in done.stdout
    assert pip_calls == ["-m pip install -r requirements.txt"]
