"""The console's Django apps import each other without a cycle.

Every module under console/ is read with ``ast`` (imports inside functions and under
TYPE_CHECKING count too: a cycle hidden in a lazy import is still a cycle) and each import of
another app becomes an edge between the two apps. The apps then have an order in which each
imports only the ones before it (core first, web last); a cycle fails the test with the imports
that close it. Cross-app reactions go the other way through hooks: console/core/events.py (any app
reports an event, the telemetry app stores it) and console/cluster/hooks.py (cluster says what
happened to a node, jobs reacts)."""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

CONSOLE = Path(__file__).resolve().parents[1] / "console"


def app_of(path: Path) -> str | None:
    parts = path.relative_to(CONSOLE).parts
    return parts[0] if len(parts) > 1 else None  # console/settings.py and the like: the project


def imported_modules(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from console import jobs" imports the app too
            found += [(node.module, node.lineno)]
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def app_imports() -> dict[tuple[str, str], list[str]]:
    """(importing app, imported app) -> where, as "path:line"."""
    apps = {p.name for p in CONSOLE.iterdir() if (p / "apps.py").exists()}
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(CONSOLE.rglob("*.py")):
        app = app_of(path)
        if app is None or "migrations" in path.parts:
            continue
        for module, line in imported_modules(ast.parse(path.read_text(), str(path))):
            parts = module.split(".")
            if len(parts) >= 2 and parts[0] == "console" and parts[1] in apps and parts[1] != app:
                where = f"{path.relative_to(CONSOLE.parent)}:{line}"
                if where not in edges[app, parts[1]]:
                    edges[app, parts[1]].append(where)
    return edges


def test_the_console_apps_import_each_other_without_a_cycle() -> None:
    edges = app_imports()
    imports: dict[str, set[str]] = defaultdict(set)
    for app, other in edges:
        imports[app].add(other)
    try:
        # (graphlib: each app after the apps it imports)
        order = list(TopologicalSorter(imports).static_order())
    except CycleError as error:
        cycle = error.args[1]  # [a, b, ..., a]: each imported by the one after it
        pairs = [(later, earlier) for earlier, later in itertools.pairwise(cycle)]
        raise AssertionError(
            "import cycle between console apps: "
            + " -> ".join(reversed(cycle))
            + "\n"
            + "\n".join(f"  {a} imports {b} at {', '.join(edges[a, b][:3])}" for a, b in pairs)
        ) from None
    assert order.index("core") < order.index("cluster") < order.index("jobs") < order.index("web")


def test_the_reader_sees_imports_inside_functions() -> None:
    tree = ast.parse("def f():\n    from console.jobs.models import Job\n")
    assert ("console.jobs.models.Job", 2) in imported_modules(tree)
