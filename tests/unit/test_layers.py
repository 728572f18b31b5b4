"""The packages of honk form layers, written down in docs/architecture.md ("Layers"): a module
imports only from its own layer and the layers below, and no two packages import each other,
even through others. Read from the sources (every ``import`` and ``from … import`` of a
``honk.*`` module, lazy ones inside functions included), never by importing them.

:data:`KNOWN_UPWARD` lists the upward imports not yet taken out, each with its module and the
package it reaches: a new one fails the test, and so does an entry that no longer exists (the
list only shrinks)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "honk"
ARCHITECTURE = REPO / "docs" / "architecture.md"
LAYER_LINE = re.compile(r"^(\d+)\. ((?:`[a-z_]+`(?:, )?)+)")  # "3. `route`, `alive`, `group`: …"

# (importing module, imported package): upward imports still to remove, with why they remain
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layers() -> dict[str, int]:
    """Package -> layer number, from the numbered list under docs/architecture.md's "## Layers"."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, int] = {}
    for line in section.splitlines():
        match = LAYER_LINE.match(line)
        if match:
            for name in re.findall(r"`([a-z_]+)`", match.group(2)):
                out[name] = int(match.group(1))
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> list[tuple[str, str]]:
    """(importing module, imported honk module) for every import in honk's Python sources."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.extend((module, alias.name) for alias in node.names if alias.name.startswith("honk."))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.startswith("honk."):
                    out.append((module, target))
    return out


def package_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages - set(layers()) == set(), "a package the layer list does not place"
    assert set(layers()) - packages == set(), "the layer list names a package that does not exist"


def test_no_module_imports_from_a_higher_layer():
    layer = layers()
    upward = set()
    for module, target in imports():
        src, dst = package_of(module), package_of(target)
        if src and dst and src != dst and layer[dst] > layer[src]:
            upward.add((module, dst))
    assert sorted(upward - KNOWN_UPWARD) == [], "imports from a higher layer"
    assert sorted(KNOWN_UPWARD - upward) == [], "listed upward imports that are gone: take them off the list"


def test_the_packages_import_each_other_in_no_cycle():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, target in imports():
        src, dst = package_of(module), package_of(target)
        if src and dst and src != dst and (module, dst) not in KNOWN_UPWARD:
            edges[src].add(dst)
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges[node]):
            if seen.get(nxt) == 1:
                raise AssertionError("packages import each other: " + " -> ".join([*path, node, nxt]))
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [])
