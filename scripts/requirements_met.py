"""Whether every requirement of a requirements file is installed at a version it allows (exit 0), or not (exit 1,
naming what is missing): `make install` runs pip only then, so it is quiet when nothing needs installing.

    python scripts/requirements_met.py requirements.txt

It reads the distributions installed in this interpreter (importlib.metadata) and compares versions with
`packaging`, which pip itself vendors; it never imports the packages, so it takes a fraction of a second.
"""
from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement


def unmet(lines: list[str]) -> list[str]:
    """The requirements among `lines` (a requirements file's) that are not installed at an allowed version."""
    missing = []
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            missing.append(f"{text} (cannot read it)")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} ({version} installed)")
    return missing


def main(argv: list[str]) -> int:
    missing = [item for path in argv for item in unmet(Path(path).read_text().splitlines())]
    if missing:
        print(f"to install: {'; '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
