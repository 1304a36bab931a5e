"""The import contracts (``[tool.importlinter]`` in pyproject.toml, run by ``make check``)
hold, and break when the rule they state is broken: none of them passes because it names
nothing. They keep the provider node installable without the platform, the apps layered
(an app imports only the ones below it) and every package free of import loops."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def _config() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["importlinter"])


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_contracts_cover_every_package_of_the_project() -> None:
    """A new top-level package that the contracts do not know could be imported by the node unseen."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert set(_config()["root_packages"]) == packages


def test_every_forbidden_third_party_name_is_a_real_package() -> None:
    """A misspelt external name (never in the import graph) would forbid nothing."""
    config = _config()
    internal = set(config["root_packages"])
    names = {
        name
        for contract in config["contracts"]
        for name in contract.get("forbidden_modules", [])
        if name.split(".")[0] not in internal
    }
    assert "django" in names
    missing = sorted(name for name in names if importlib.util.find_spec(name) is None)
    assert not missing, f"forbidden modules that no installed package provides: {missing}"


def test_the_contracts_hold_on_this_tree() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(_config()['contracts'])} kept, 0 broken" in result.stdout


def test_each_contract_breaks_when_its_rule_is_broken(tmp_path: Path) -> None:
    """A copy of the tree where protocol imports training, training imports Django, the
    agent imports a platform module of workers and the Redis client, workers/__init__.py
    imports Django, the ledger imports the marketplace above it, workers' live state imports
    the assignments above it, and two modules of config import each other: every contract
    reports the import that breaks it."""
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "migrations", "templates", "static")
    for package in _config()["root_packages"]:
        shutil.copytree(ROOT / package, tree / package, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    breaks = {
        "protocol/bech32.py": "import training.poc.spec\n",
        "training/loop.py": "import django.conf\n",
        "workers/agent/trust.py": "from workers import models\n",
        "workers/agent/reporter.py": "import redis\n",
        "workers/__init__.py": "import django\n",
        "ledger/services.py": "import marketplace.models\n",
        "workers/live/task_page.py": "import workers.assignments.jobs\n",
        "config/owned.py": "import config.events\n",
        "config/events.py": "import config.owned\n",
    }
    for path, line in breaks.items():
        with (tree / path).open("a") as f:
            f.write(line)

    result = _lint(tree)

    assert result.returncode == 1, result.stdout + result.stderr
    names = [contract["name"] for contract in _config()["contracts"]]
    for name in names:
        assert f"{name} BROKEN" in result.stdout, result.stdout
    for importer, imported in (
        ("protocol.bech32", "training.poc.spec"),
        ("training.loop", "django"),  # third-party packages are named by their root
        ("workers.agent.trust", "workers.models"),
        ("workers.agent.reporter", "redis"),
        ("workers", "django"),
        ("ledger.services", "marketplace.models"),
        ("workers.live.task_page", "workers.assignments.jobs"),
    ):
        assert f"{importer} -> {imported} (" in result.stdout, result.stdout
    assert "No cycles are allowed in config." in result.stdout, result.stdout
