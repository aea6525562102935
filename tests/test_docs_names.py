"""docs/architecture.md and README.md name code in backticks; every name they give must exist.

A span is read as a reference to code when it looks like one:
- a path that starts in a top-level directory of the repository or names a source file
  (``console/core/decision.py``, ``ps/contract.py``, ``bench/warm_teardown``): a tracked file or
  directory whose path is, or ends with, it (an all-capitals segment such as ``NAME`` is a
  placeholder);
- a dotted name (``jobs.actions.submit_job``, ``Job.set_state``, ``warm.preload``): a module whose
  dotted path ends with its first parts, defining the rest (a top-level name, or a member of a
  class there: a method, a class attribute or field, an attribute ``__init__`` sets); or a class
  anywhere with that member. A dotted name that is not code but a string of it (an event kind
  such as ``round.inplace_failed``) must appear in the code verbatim. Names of libraries the code
  imports (``torch.save``, ``gc.freeze``) are not ours to check;
- an identifier with an underscore or a capital, or called (``change_membership(job, reason)``,
  ``decision()``, ``RoundSpec``,
  ``AGENT_HEARTBEAT_NOW``, ``TRAINYARD_HOME``, a metric such as ``ps_rows``): a word of the code
  (console/, workers/, tests/, bench/, bin/, the build and compose files; a Prometheus counter's
  ``_total`` suffix is added by the client library).
Everything else (commands, URLs, values such as ``start`` or ``--reps``) is prose.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "docs" / "architecture.md", REPO / "README.md"]
CODE_ROOTS = ("console", "workers", "tests", "bench")
SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[\w.\-]+(/[\w.\-]+)*/?$")
FILE = re.compile(r"\.(py|js|md|toml|ya?ml|html|css|proto)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\([^()]*\))?$")
TEXT_ROOTS = ("bin/", ".ci/", "Dockerfile", "docker-compose.yml", "pyproject.toml", "frontend/src/")
# Relative to these when a doc names a file inside a package ("ps/contract.py" in workers/).
PLACES = ("", "console/", "workers/", "workers/agent/", "console/jobs/", "frontend/src/")


@dataclass
class Module:
    names: set[str] = field(default_factory=set)
    classes: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class Index:
    modules: dict[str, Module]
    classes: dict[str, list[set[str]]]
    words: set[str]
    strings: str
    external: set[str]
    files: list[str]
    tops: set[str]


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for elt in node.elts for n in _targets(elt)]
    return []


def _members(cls: ast.ClassDef) -> set[str]:
    """A class's names: its body's, and the attributes its methods set on ``self``."""
    names = _defined_in(cls.body)
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def _defined_in(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(n for target in stmt.targets for n in _targets(target))
        elif isinstance(stmt, ast.AnnAssign):
            names.update(_targets(stmt.target))
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                names |= _defined_in(getattr(stmt, block, []) or [])
            for handler in getattr(stmt, "handlers", []):
                names |= _defined_in(handler.body)
    return names


@functools.cache
def index() -> Index:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    modules: dict[str, Module] = {}
    classes: dict[str, list[set[str]]] = {}
    words: set[str] = set()
    strings: list[str] = []
    external: set[str] = set()
    for name in files:
        path = REPO / name
        if not path.is_file() or path == Path(__file__):  # (its own examples of missing names)
            continue
        if (name.startswith(TEXT_ROOTS) and not name.startswith("frontend/src/")) or name.endswith(".js"):
            words.update(re.findall(r"\w+", path.read_text(errors="replace")))
        if not name.endswith(".py") or not name.startswith((*CODE_ROOTS, "manage.py")):
            continue
        source = path.read_text()
        words.update(re.findall(r"\w+", source))
        tree = ast.parse(source)
        module = Module(_defined_in(tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = _members(node)
                module.classes.setdefault(node.name, set()).update(members)
                classes.setdefault(node.name, []).append(members)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
            elif isinstance(node, ast.Import):
                external.update(a.asname or a.name.split(".")[0] for a in node.names if not _ours(a.name))
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module
                and not _ours(node.module)
                and node.level == 0
            ):
                external.update(a.asname or a.name for a in node.names)
                external.add(node.module.split(".")[0])
        dotted = name[: -len(".py")].replace("/", ".")
        modules[dotted.removesuffix(".__init__")] = module
    tops = {f.split("/")[0] for f in files if "/" in f}
    return Index(modules, classes, words, "\n".join(strings), external, files, tops)


def _ours(module: str) -> bool:
    return module.split(".")[0] in (*CODE_ROOTS, "manage")


def path_exists(ref: str) -> bool:
    files = index().files
    parts = [p for p in ref.rstrip("/").split("/") if p not in ("", ".", "..")]  # (`../x.js`: from a module)
    ref = "/".join(parts)
    pattern = "/".join("[^/]+" if p.isupper() and len(p) > 1 else re.escape(p) for p in parts)
    found = re.compile(rf"(^|/){pattern}(/|$)")
    for place in PLACES:
        if (REPO / place / ref).exists():
            return True
    return any(found.search(f) for f in files)


def _resolves_in(module: Module, rest: list[str]) -> bool:
    if not rest:
        return True
    if len(rest) == 1:
        return (
            rest[0] in module.names
            or rest[0] in module.classes
            or any(rest[0] in members for members in module.classes.values())  # `actor.carry_over`
        )
    return len(rest) == 2 and rest[1] in module.classes.get(rest[0], set())


def dotted_exists(ref: str) -> bool:
    """A module (by the end of its dotted path) and what it defines, or a class and its member;
    else the dotted text as a string in the code (an event kind)."""
    idx = index()
    parts = ref.split(".")
    if len(parts) == 1:
        # (a Prometheus counter is exposed with `_total` added to the name the code gives it)
        return ref in idx.words or (ref.endswith("_total") and ref.removesuffix("_total") in idx.words)
    for k in range(len(parts), 0, -1):
        suffix = ".".join(parts[:k])
        for name, module in idx.modules.items():
            if (name == suffix or name.endswith("." + suffix)) and _resolves_in(module, parts[k:]):
                return True
    if len(parts) == 2 and any(parts[1] in members for members in idx.classes.get(parts[0], [])):
        return True
    return re.search(rf"(^|[^\w.]){re.escape(ref)}($|[^\w])", idx.strings, re.M) is not None


def references(text: str) -> list[tuple[str, str]]:
    """(kind, reference) for every span of ``text`` that names code."""
    idx = index()
    found = []
    for span in SPAN.findall(text):
        span = span.strip()
        if span.startswith(("/", "$", "<", "-", "_")) or " " in span or "=" in span:
            continue  # URLs, shell, options, name fragments (`_ratio`)
        if "/" in span or FILE.search(span):
            if PATH.match(span) and (span.split("/")[0] in idx.tops or FILE.search(span.rstrip("/"))):
                found.append(("path", span))
            continue
        if span.startswith(".") or not DOTTED.match(span):
            continue
        name = span.split("(")[0]
        first = name.split(".")[0]
        if "." in name and (
            first in idx.external or any(p.isupper() and len(p) > 1 for p in name.split("."))
        ):
            continue  # a library's name (`torch.save`), or a pattern (`node.NAME`)
        if "." in name or "_" in name or any(c.isupper() for c in name) or span.endswith(")"):
            found.append(("name", name))
    return found


def missing(doc: Path) -> list[str]:
    gone = []
    for kind, ref in references(doc.read_text()):
        ok = path_exists(ref) if kind == "path" else dotted_exists(ref)
        if not ok:
            gone.append(f"{kind} `{ref}`")
    return sorted(set(gone))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_module_file_and_function_a_doc_names_exists(doc: Path) -> None:
    gone = missing(doc)
    assert not gone, f"{doc.relative_to(REPO)} names code that does not exist: " + ", ".join(gone)


def test_the_checker_sees_a_name_that_is_gone() -> None:
    # A doc that names what exists passes; one that names a function, a member or a file that
    # does not is caught (the architecture doc's `supervisor._regroup` was such a name).
    text = "`console/core/decision.py` `decision()` `Job.set_state` `jobs.actions.submit_job` `warm.preload`"
    assert [ref for ref in references(text)] == [
        ("path", "console/core/decision.py"),
        ("name", "decision"),
        ("name", "Job.set_state"),
        ("name", "jobs.actions.submit_job"),
        ("name", "warm.preload"),
    ]
    assert all(dotted_exists(ref) or path_exists(ref) for _, ref in references(text))
    for gone in (
        "supervisor._regroup",
        "Job.set_status",
        "jobs.actions.submit_jobs",
        "no_such_function_here",
    ):
        assert not dotted_exists(gone), gone
    assert not path_exists("console/core/decisions.py")
    assert not path_exists("bench/no_such_bench")
