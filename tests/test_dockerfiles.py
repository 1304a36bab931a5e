"""The images, read (no Docker here): Dockerfile.node installs the node extra and never the
platform, on a CUDA PyTorch base whose torch is the pinned one, runs as a non-root user
with its key volume and ``python -m workers.agent`` as entrypoint; docker-compose's agent
uses it and shares nothing with the platform's services."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import tomllib
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[1]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", dockerfile.read_text())
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (what precedes the first FROM is stage 0's)."""
    found: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM" and found[-1] and any(i[0] == "FROM" for i in found[-1]):
            found.append([])
        found[-1].append(instruction)
    return found


def pins() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pins", ROOT / "deploy" / "pins.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_pin() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        node = tomllib.load(f)["project"]["optional-dependencies"]["node"]
    return next(r.split("==")[1] for r in node if r.startswith("torch=="))


def pip_commands(steps: list[tuple[str, str]]) -> list[str]:
    return [cmd for word, args in steps if word == "RUN" for cmd in args.split("&&") if re.search(r"\bpip\b", cmd)]


def test_the_node_image_installs_the_node_extra_and_nothing_of_the_platform() -> None:
    steps = instructions(ROOT / "Dockerfile.node")
    commands = pip_commands(steps) + [args for word, args in steps if word == "RUN" and "pins.py" in args]
    assert commands
    extras = {extra for cmd in commands for extra in re.findall(r"\[([A-Za-z_][\w,-]*)\]", cmd)}
    assert extras == {"node"}, commands
    assert {arg for cmd in commands for arg in re.findall(r"pins\.py (\w+)", cmd)} == {"node"}, commands
    for cmd in commands:
        assert not re.search(r"\s-e\s|--editable|requirements-|\bdjango\b", cmd, re.IGNORECASE), cmd
    # Every pip install in the final image names the node extra or its pins, nothing else.
    for cmd in pip_commands(stages(ROOT / "Dockerfile.node")[-1]):
        if " install " in cmd:
            assert "[node]" in cmd or "requirements.txt" in cmd, cmd


def test_the_node_extra_holds_nothing_of_the_platform() -> None:
    node = {r.split("==")[0].lower() for r in pins().pins(["node"])}
    platform_only = {r.split("==")[0].split("[")[0].lower() for r in pins().pins(["platform"])} - node
    assert "django" in platform_only
    assert not node & {"django", "djangorestframework", "channels", "daphne", "redis", "stripe", "psycopg"}
    assert "torch" in node


def test_the_node_image_runs_the_agent_as_a_user_with_its_key_volume_on_a_cuda_torch_base() -> None:
    steps = instructions(ROOT / "Dockerfile.node")
    base = next(args for word, args in steps if word == "ARG" and args.startswith("BASE="))
    image, tag = base.removeprefix("BASE=").split(":")
    assert image == "pytorch/pytorch"
    assert tag.startswith(f"{torch_pin()}-cuda"), tag
    assert tag.endswith("-runtime"), tag

    final = stages(ROOT / "Dockerfile.node")[-1]
    words = [word for word, _ in final]
    assert words.index("USER") < words.index("ENTRYPOINT")
    user = next(args for word, args in final if word == "USER")
    assert user not in ("root", "0")
    assert json.loads(next(args for word, args in final if word == "ENTRYPOINT")) == ["python", "-m", "workers.agent"]
    assert next(args for word, args in final if word == "VOLUME") == "/node"
    assert next(args for word, args in final if word == "WORKDIR") == "/node"  # ./worker.pem is in the volume
    # The runtime image takes the built wheel and pyproject.toml, not the checkout.
    copies = [args for word, args in final if word == "COPY"]
    assert not any(re.fullmatch(r"(--\S+\s+)*\.\s+\S+", c) for c in copies), copies


def test_the_platform_image_installs_the_platform_extra() -> None:
    commands = pip_commands(instructions(ROOT / "Dockerfile"))
    assert any("'.[platform]'" in cmd for cmd in commands), commands


def test_compose_runs_the_agent_from_the_node_image_with_a_volume_of_its_own() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    agent = services["agent"]
    assert agent["build"]["dockerfile"] == "Dockerfile.node"
    assert agent["command"][0] == "run"  # the image's entrypoint is python -m workers.agent
    assert "environment" not in agent  # no platform secret, database or Redis URL
    volumes = {v.split(":")[0] for v in agent["volumes"]}
    others = {v.split(":")[0] for name, s in services.items() if name != "agent" for v in s.get("volumes", [])}
    assert volumes
    assert not volumes & others


def test_compose_keeps_the_agent_off_the_network_of_redis_and_postgres() -> None:
    """The untrusted node's container cannot even open a connection to the platform's Redis
    (no password: its broker, channel layer and cache) or its database: without networks
    of their own, every compose service shares one network and the agent reaches
    redis:6379 directly, the attack of issue 22."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]

    def networks(name: str) -> set[str]:
        given = services[name].get("networks")
        return set(given or ["default"])

    agent = networks("agent")
    for private in ("redis", "postgres"):
        assert not agent & networks(private), f"the agent shares {agent & networks(private)} with {private}"
    # What the node needs is still reachable: the platform's API and the node broker.
    assert agent & networks("web")
    assert agent & networks("rabbitmq")


def test_neither_image_takes_the_compose_secrets_file() -> None:
    """docker-compose reads its secrets (database, RabbitMQ administrator and publishing
    passwords) from ``.env`` beside it; the platform image copies the whole checkout
    (``COPY . .``), so without an ignore rule that file would be baked into the image."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in (".env", ".env.production"):
        assert any(fnmatch.fnmatch(name, p) for p in patterns), f"{name} would be copied into the images"
