"""deploy/ and docs/deployment.md: the Compose file is valid YAML of the expected shape, and every file names
only settings that exist and kvgate commands and options that parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.exceptions import TyperException

from kvgate import REPO_ROOT
from kvgate.settings_table import SETTINGS_CLASSES

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
ENV_EXAMPLES = sorted((DEPLOY / "systemd").glob("*.env.example"))
NAMING_FILES = [COMPOSE, *UNITS, *ENV_EXAMPLES, REPO_ROOT / "docs" / "deployment.md"]
# Issue 16's fixed points, added by its other branches (remote engines, KV events, the Redis KV tier):
# named here so this branch's files can use them; each exists once those branches are merged.
SETTING = re.compile(r"\bKVGATE_[A-Z0-9_]*[A-Z0-9]\b")  # KVGATE_KV_* (a family) is no name


def known_settings() -> set[str]:
    names = set()
    for cls, _ in SETTINGS_CLASSES:
        prefix = cls.model_config.get("env_prefix", "")
        for name, field in cls.model_fields.items():
            names.add(f"{prefix}{name}".upper())
            names.update(str(c).upper() for c in getattr(field.validation_alias, "choices", None) or ())
    return names


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_checks_can_fail() -> None:
    assert "KVGATE_REDIS_URL" in known_settings() and "KVGATE_DRAIN_TOKEN" in known_settings()
    assert "KVGATE_REDIS_URLS" not in known_settings()
    for bad in (["serve", "--no-such-option"], ["engine", "drain"], ["engine", "nope"]):
        with pytest.raises(TyperException):  # typer's own click: its UsageError
            parse_kvgate(bad)


@pytest.mark.parametrize("path", NAMING_FILES, ids=lambda p: p.name)
def test_files_name_only_settings_that_exist(path: Path) -> None:
    named = set(SETTING.findall(path.read_text()))
    assert named, f"{path} names no setting"
    unknown = named - known_settings()
    assert not unknown, f"{path.name} names settings that do not exist: {sorted(unknown)}"


def test_compose_file_is_valid_yaml_with_gateways_engines_and_services() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "redis-kv", "nats"} <= set(services)
    gateways = [s for name, s in services.items() if name.startswith("gateway-")]
    engines = [s for name, s in services.items() if name.startswith("engine-")]
    assert len(gateways) >= 2 and len(engines) >= 2
    for service in services.values():
        env = service.get("environment", {})
        assert isinstance(env, dict)  # mappings (anchors merged), values strings: Compose's own rules
        assert all(isinstance(v, str) for v in env.values()), env
    for gateway in gateways:
        env = gateway["environment"]
        assert env["KVGATE_DATABASE_URL"].startswith("postgresql://")  # more than one gateway: PostgreSQL
        assert env["KVGATE_REDIS_URL"].startswith("redis://:${REDIS_PASSWORD")  # Redis with a password
        assert "${NATS_TOKEN" in env["KVGATE_NATS_URL"]  # NATS with a token
        assert "KVGATE_ENGINE_TOKEN" in env  # sent to the engines
        engine_urls = env["KVGATE_ENGINES"].split(",")
        assert len(engine_urls) == len(engines)
    # Trust boundaries (issue 25): every engine that listens beyond loopback has a token, every
    # Redis a password, NATS a token.
    for engine in engines:
        command = engine["command"]
        beyond_loopback = command[command.index("--host") + 1] not in ("127.0.0.1", "::1", "localhost")
        assert not beyond_loopback or engine["environment"].get("KVGATE_ENGINE_TOKEN"), engine
        assert engine["environment"]["KVGATE_KV_REDIS_URL"].startswith("redis://:${REDIS_PASSWORD")
    for name in ("redis", "redis-kv"):
        assert "--requirepass" in services[name]["command"], name
    assert "--auth" in services["nats"]["command"]
    ids = {e["environment"]["KVGATE_ENGINE_ID"] for e in engines}
    assert len(ids) == len(engines)  # one id per engine in the event stream
    assert all(e["restart"] == "on-failure" for e in engines)  # a drained engine (exit 0) stays down
    # What the services refer to exists: other services, declared volumes.
    declared = set(compose()["volumes"])
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services) - {name}, name
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            assert source.startswith(("/", ".")) or source in declared, (name, mount)


def parse_kvgate(args: list[str]) -> None:
    """Parse a `kvgate ...` command line the way the CLI would, without running it (a usage error if bad)."""
    from kvgate.cli import app

    command: Any = typer.main.get_command(app)
    ctx = command.make_context("kvgate", list(args))
    while hasattr(command, "get_command"):  # a group
        # A group keeps its subcommand and what follows (click 8.2+: in _protected_args, then args).
        remaining = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not remaining:
            break
        name, *rest = remaining
        sub = command.get_command(ctx, name)
        if sub is None:
            raise TyperException(f"no such command: {name}")
        command, ctx = sub, sub.make_context(name, rest, parent=ctx)


def kvgate_command_lines() -> list[list[str]]:
    lines = []
    for service in compose()["services"].values():
        command = service.get("command")
        if isinstance(command, list) and command[0] == "kvgate":
            lines.append(command[1:])
    for unit in UNITS:
        for line in unit.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStop=")):
                argv = shlex.split(line.split("=", 1)[1].lstrip("-").replace("%i", "8001"))
                assert Path(argv[0]).name == "kvgate", line
                lines.append(argv[1:])
    return lines


def test_deploy_files_run_kvgate_commands_that_parse() -> None:
    lines = kvgate_command_lines()
    assert ["engine", "drain", "http://127.0.0.1:8001"] in lines
    assert sum(line[:2] == ["engine", "serve"] for line in lines) >= 2
    for line in lines:
        parse_kvgate(line)


def test_units_say_what_systemd_needs() -> None:
    for unit in UNITS:
        sections = re.findall(r"^\[(\w+)\]$", unit.read_text(), flags=re.M)
        assert sections == ["Unit", "Service", "Install"], unit.name
        text = unit.read_text()
        assert "EnvironmentFile=/etc/kvgate/" in text and "Restart=on-failure" in text
