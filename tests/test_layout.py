"""The package layout is the architecture: the launcher above, the four loops side by side, what they
all stand on below. Imports point one way: a loop never imports another loop (what two loops need
lives below both) nor the launcher, and the ground floor imports no loop."""

from __future__ import annotations

import ast
from pathlib import Path

import openclaw_rl

PACKAGE = Path(openclaw_rl.__file__).parent
LOOPS = ("envs", "judge", "policy", "trainer")
BELOW = ("runtime", "config.py", "types.py")


def _imports(path: Path) -> set[str]:
    """Every openclaw_rl sub-package or top-level module a module imports."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ("openclaw_rl", "trainer")
    return _imported(path.read_text(), package)


def _imported(source: str, package: tuple[str, ...]) -> set[str]:
    """What ``source``, a module of ``package``, imports from openclaw_rl, at any depth of the file
    (lazy imports count), relative imports resolved against ``package``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                names = [".".join((*base, node.module)) if node.module else ".".join(base)]
                names += [".".join((*base, alias.name)) for alias in node.names] if not node.module else []
            elif node.module == "openclaw_rl":  # from openclaw_rl import envs
                names = [f"openclaw_rl.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "openclaw_rl" and len(parts) > 1:
                found.add(parts[1])
    return found


def _offences(where: str, forbidden: set[str]) -> list[str]:
    paths = sorted((PACKAGE / where).rglob("*.py")) if (PACKAGE / where).is_dir() else [PACKAGE / where]
    return [
        f"{path.relative_to(PACKAGE.parent)} imports openclaw_rl.{name}"
        for path in paths
        for name in sorted(_imports(path) & forbidden)
    ]


def test_loops_import_no_other_loop_and_not_the_launcher():
    offences = [o for loop in LOOPS for o in _offences(loop, (set(LOOPS) - {loop}) | {"launcher", "cli"})]
    assert offences == []


def test_the_ground_floor_imports_no_loop():
    offences = [o for pkg in BELOW for o in _offences(pkg, set(LOOPS) | {"launcher", "cli"})]
    assert offences == []


def test_every_loop_package_is_where_the_test_expects():
    assert all((PACKAGE / name / "__init__.py").is_file() for name in (*LOOPS, "runtime", "launcher"))
    assert all((PACKAGE / name).is_file() for name in ("config.py", "types.py"))


def test_relative_imports_are_resolved():
    """A sideways import written relatively is caught too (the check itself can fail)."""
    assert _imports(PACKAGE / "trainer" / "loop.py") >= {"runtime", "config"}
    source = "from ..policy import server\nfrom . import loop\nfrom .. import judge\n"
    assert _imported(source, ("openclaw_rl", "trainer")) == {"policy", "trainer", "judge"}
    assert _imported("from openclaw_rl import envs\n", ("openclaw_rl", "trainer")) == {"envs"}
