"""docs/provider-node.md's commands are the agent's: each one it shows, run directly or
as the Docker image's arguments, parses with the agent's own command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from workers.agent.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "provider-node.md"


def shown_agent_commands() -> list[list[str]]:
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line)  # a trailing comment
            line = re.sub(r"\[[^\]]*\]", "", line)  # an optional part, [--name gpu-1]
            for marker in ("workers.agent ", "proofwork-node "):
                if marker in line and not line.lstrip().startswith("docker build"):
                    commands.append(shlex.split(line.split(marker, 1)[1]))
    return commands


def test_the_doc_shows_init_register_and_run_both_ways() -> None:
    shown = [command[0] for command in shown_agent_commands()]
    assert shown.count("init") == 2
    assert shown.count("register") == 2
    assert shown.count("run") == 2


@pytest.mark.parametrize("argv", shown_agent_commands(), ids=lambda argv: " ".join(argv))
def test_each_command_the_doc_shows_parses(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.command == argv[0]
