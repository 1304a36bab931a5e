"""The docs a newcomer reads: a README that fits on two screens, and links that resolve.

Every relative link in README.md and docs/*.md must name a file or folder of this
repository: a doc that points nowhere is a dead end for the reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) links; the target stops at whitespace, ')' or '#'
LINK = re.compile(r"\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_readme_fits_on_two_screens() -> None:
    assert len((ROOT / "README.md").read_text()) <= 6000


def test_readme_points_to_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [p.name for p in DOCS[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md does not point to {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not files here
            continue
        resolved = (doc.parent / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert not broken, f"{doc.name} links to what is not in the repository: {broken}"
