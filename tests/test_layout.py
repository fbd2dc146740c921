"""The package layout is the architecture: the launcher above, the four loops side by side, what they
all stand on below. Imports point one way: a loop never imports another loop (what two loops need
lives below both) nor the launcher, and the ground floor imports no loop."""

from __future__ import annotations

import ast
from pathlib import Path

import openclaw_rl

PACKAGE = Path(openclaw_rl.__file__).parent
LOOPS = ("envs", "judge", "policy", "trainer")
BELOW = ("runtime",)  # with the top-level modules config.py and types.py


def _imports(path: Path) -> set[str]:
    """Every openclaw_rl sub-package a module imports, at any depth of the file (lazy imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "openclaw_rl" and len(parts) > 1:
                found.add(parts[1])
    return found


def _offences(package: str, forbidden: set[str]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)} imports openclaw_rl.{name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in sorted(_imports(path) & forbidden)
    ]


def test_loops_import_no_other_loop_and_not_the_launcher():
    offences = [o for loop in LOOPS for o in _offences(loop, (set(LOOPS) - {loop}) | {"launcher", "cli"})]
    assert offences == []


def test_the_ground_floor_imports_no_loop():
    offences = [o for pkg in BELOW for o in _offences(pkg, set(LOOPS) | {"launcher", "cli"})]
    assert offences == []


def test_every_loop_package_is_where_the_test_expects():
    assert all((PACKAGE / name / "__init__.py").is_file() for name in (*LOOPS, *BELOW, "launcher"))
