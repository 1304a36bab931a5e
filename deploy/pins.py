"""Print the pinned requirements of pyproject.toml's extras, one a line:
``python pins.py node`` (the provider node), ``python pins.py platform``.

The Dockerfiles install these from pyproject.toml alone, before the code is copied, so
that a code change reuses the dependency layer; the versions stay pinned only in
pyproject.toml. An extra that names the project's own (``proofwork[node]``) brings that
extra's requirements in its place. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def pins(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """The requirements of ``extras``, the project's own extras expanded, each once, in order."""
    with pyproject.open("rb") as f:
        project = tomllib.load(f)["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    found: list[str] = []
    seen: set[str] = set()

    def add(extra: str) -> None:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r} (it has {', '.join(optional)})")
        if extra in seen:
            return
        seen.add(extra)
        for requirement in optional[extra]:
            own = re.fullmatch(rf"{re.escape(project['name'])}\[([\w,\s-]+)\]", requirement)
            if own:
                for name in own.group(1).split(","):
                    add(name.strip())
            elif requirement not in found:
                found.append(requirement)

    for extra in extras:
        add(extra)
    return found


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(pins(sys.argv[1:])))
