"""The packages' layering, read from the imports of every source file (with ast, so lazy imports inside
functions and imports under TYPE_CHECKING count too).

From the bottom up:
- kvgate/ core (db, errors, settings, tenancy, usage, logs) imports none of the packages above it;
- inference/ (the engine) imports kvgate core only: neither gateway nor billing;
- gateway/ never imports billing: billing reaches it through the seam (gateway.billing_hooks);
- billing/ imports gateway only through the seam modules below;
- web/ (the dashboard) sits above gateway and billing and may use both; none of them imports it;
- alerts/ sits above billing and below the dashboard (which uses it); it imports neither gateway nor web, and
  kvgate core, inference, gateway and billing never import it;
- the composition root (kvgate/app.py, kvgate/cli.py, and kvgate/settings_table.py, which lists every
  package's settings for the README) is the one place that imports all of them, and nothing imports it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from kvgate import REPO_ROOT

PACKAGES = ("kvgate", "inference", "gateway", "billing", "web", "alerts")
COMPOSITION_ROOT = ("kvgate.app", "kvgate.cli", "kvgate.settings_table")
# What billing may import from the gateway: the hooks seam (Admission, BillingHooks) and the usage recorder.
BILLING_SEAMS = ("gateway.billing_hooks", "gateway.usage")


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: str) -> str:
    """'gateway/api/errors.py' -> 'gateway.api.errors'; a package's __init__.py is the package."""
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str) -> Iterator[tuple[int, str]]:
    """(line, imported name) for every import in a module; `from a import b` yields 'a.b'."""
    package = module.split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                base = ".".join([*package[: len(package) - node.level], *([base] if base else [])])
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


# What each layer may not import (besides the composition root, which no layer imports).
FORBIDDEN = {
    "kvgate": (("inference", "gateway", "billing", "web", "alerts"), "kvgate core imports nothing above it"),
    "inference": (("gateway", "billing", "web", "alerts"), "inference imports neither gateway nor billing"),
    "gateway": (("billing", "web", "alerts"), "gateway never imports billing"),
    "billing": (("web", "alerts"), "billing never imports the dashboard"),
    # The composition root hands alerts the dashboard's mailer and the gateway's sessions.
    "alerts": (("gateway", "web"), "alerts imports neither the gateway nor the dashboard"),
}


def rule_broken(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None if it may."""
    if any(within(imported, root) for root in COMPOSITION_ROOT):
        return None if importer in COMPOSITION_ROOT else "only the composition root's own modules import it"
    if importer in COMPOSITION_ROOT:
        return None
    layer = importer.split(".")[0]
    above, reason = FORBIDDEN.get(layer, ((), ""))
    if any(within(imported, package) for package in above):
        return reason
    seam = any(within(imported, seam) for seam in BILLING_SEAMS)
    if layer == "billing" and within(imported, "gateway") and not seam:
        return f"billing imports gateway only through {', '.join(BILLING_SEAMS)}"
    return None


def violations(sources: Mapping[str, str]) -> list[str]:
    """Every import that breaks the layering, as 'path:line: importer imports name (the rule)'."""
    found = []
    for path, source in sorted(sources.items()):
        importer = module_name(path)
        for line, name in imports(source, importer):
            reason = rule_broken(importer, name)
            if reason is not None:
                found.append(f"{path}:{line}: {importer} imports {name} ({reason})")
    return found


def imports_by_string(sources: Mapping[str, str]) -> list[str]:
    """Calls that find a module by its name at run time (importlib.import_module, __import__): edges an
    import scan cannot see. There are none: the composition root imports what it wires."""
    found = []
    for path, source in sorted(sources.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("import_module", "__import__"):
                    found.append(f"{path}:{node.lineno}: {name}()")
    return found


def source_files() -> dict[str, str]:
    files = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            files[str(path.relative_to(REPO_ROOT))] = path.read_text()
    return files


def test_the_packages_are_layered() -> None:
    files = source_files()
    assert len(files) > 100 and "billing/hooks.py" in files and "kvgate/app.py" in files
    assert violations(files) == []
    assert imports_by_string(files) == []


def test_the_seams_are_really_used() -> None:
    # The allowed edges exist: billing reaches the gateway through its seams, the root wires both.
    edges = {(module_name(p), name) for p, s in source_files().items() for _, name in imports(s, module_name(p))}
    assert any(m.startswith("billing") and within(n, "gateway.billing_hooks") for m, n in edges)
    assert any(m == "kvgate.app" and within(n, "billing") for m, n in edges)
    assert any(m == "kvgate.app" and within(n, "gateway") for m, n in edges)


def test_each_rule_catches_a_violation() -> None:
    broken = {
        "gateway/services/x.py": "def f():\n    from billing.hooks import GatewayBilling\n",
        "billing/x.py": "from gateway.generation import Generation\n",
        "billing/y.py": "from gateway import state\n",
        "inference/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gateway.app\n",
        "kvgate/usage.py": "from inference.types import Usage\n",
        "kvgate/errors.py": "from . import app\n",  # relative: kvgate.app, the root
        "gateway/x.py": "from kvgate.cli import main\n",
        "billing/z.py": "from web.summaries import tenant_overview\n",
    }
    found = violations(broken)
    assert [f.split(":")[0] for f in found] == sorted(broken)
    by_path = {f.split(":")[0]: f for f in found}
    assert "gateway never imports billing" in by_path["gateway/services/x.py"]
    assert "kvgate.app" in by_path["kvgate/errors.py"]
    assert "billing never imports the dashboard" in by_path["billing/z.py"]
    by_name = {"gateway/app.py": "import importlib\n\ndef f():\n    return importlib.import_module('billing.hooks')\n"}
    assert imports_by_string(by_name) == ["gateway/app.py:4: import_module()"]


def test_allowed_imports_pass() -> None:
    allowed = {
        "billing/x.py": "from gateway.usage import UsageRecorder\nfrom gateway import billing_hooks\n",
        "billing/y.py": "import kvgate.db\nfrom inference.types import Usage\n",
        "gateway/x.py": "from inference.types import Usage\nfrom kvgate.usage import TokenCounts\n",
        "inference/x.py": "from kvgate.logs import configure_logging\n",
        "kvgate/usage.py": "from kvgate.db import Base\n",
        "kvgate/app.py": "from billing import api\nfrom gateway import app\n",
        "kvgate/cli.py": "from kvgate.app import create_app\n",
    }
    assert violations(allowed) == []


# Modules of a few hundred lines stay readable in one sitting (issue 10); a bigger one is split by idea.
MAX_MODULE_LINES = 400


def oversized(sources: Mapping[str, str], *, limit: int = MAX_MODULE_LINES) -> list[str]:
    return [
        f"{path}: {source.count(chr(10))} lines"
        for path, source in sorted(sources.items())
        if path.startswith(("gateway/", "billing/", "alerts/")) and source.count("\n") > limit
    ]


def test_no_gateway_or_billing_module_is_over_400_lines() -> None:
    assert oversized(source_files()) == []


def test_the_size_check_catches_a_long_module() -> None:
    assert oversized({"billing/long.py": "x = 1\n" * 401, "inference/long.py": "x = 1\n" * 401}) == [
        "billing/long.py: 401 lines"
    ]
    assert oversized({"gateway/short.py": "x = 1\n" * 400}) == []
