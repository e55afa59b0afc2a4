"""pyproject.toml tells the truth about the package: the Python it needs is the one mypy
checks against, and every third-party library server/nereid imports is declared (a
module-level import in the base dependencies, a lazy one at least in an optional extra).
The imports are read from the source with ast, so a new one cannot slip in undeclared."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "server" / "nereid"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: Import names whose distribution is named otherwise. Any other import name ``x_y`` is
#: looked up as the distribution ``x-y`` (PEP 503 normalisation: ml_dtypes -> ml-dtypes).
DISTRIBUTION_OF = {
    "google": "protobuf",  # google.protobuf
    "grpc": "grpcio",
}


def normalise(name: str) -> str:
    """PEP 503: case and runs of ``-_.`` do not matter in a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """``"tritonclient[grpc]>=2.50; sys_platform != 'win32'"`` -> ``tritonclient``."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"pyproject.toml: not a requirement: {requirement!r}"
    return normalise(match[1])


BASE = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {
    extra: {requirement_name(r) for r in requirements}
    for extra, requirements in PYPROJECT["project"]["optional-dependencies"].items()
}


def third_party_imports() -> dict[str, dict[str, set[str]]]:
    """{top-level import name: {"module": {files}, "lazy": {files}}} for every import in
    server/nereid that is neither the standard library nor nereid. "module": imported when
    the module is (its top level or an ``if`` there, not under ``TYPE_CHECKING``);
    "lazy": imported inside a function."""
    found: dict[str, dict[str, set[str]]] = {}

    def visit(node: ast.AST, where: str, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, where, True)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # for the type checker only: never imported at run time
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and (child.level or child.module is None):
                    continue  # relative: inside nereid
                modules = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module]
                for module in modules:
                    top = str(module).split(".")[0]
                    if top != "nereid" and top not in sys.stdlib_module_names:
                        kind = "lazy" if lazy else "module"
                        found.setdefault(top, {"module": set(), "lazy": set()})[kind].add(where)
            else:
                visit(child, where, lazy)

    for path in sorted(PACKAGE.rglob("*.py")):
        visit(ast.parse(path.read_text(), str(path)), str(path.relative_to(ROOT)), False)
    return found


IMPORTS = third_party_imports()


def test_requires_python_is_the_version_mypy_checks_against() -> None:
    requires = PYPROJECT["project"]["requires-python"]
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires.strip())
    assert match, f"pyproject.toml: requires-python: expected '>=X.Y', got {requires!r}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{match[1]}.{match[2]}", (
        f"pyproject.toml: [tool.mypy] python_version is {PYPROJECT['tool']['mypy']['python_version']!r}, "
        f"requires-python is {requires!r}"
    )
    assert sys.version_info >= (int(match[1]), int(match[2])), f"this interpreter is older than {requires}"


def test_the_scan_sees_the_libraries_the_server_is_built_on() -> None:
    # guards the scan itself: if it found nothing, the tests below could not fail
    assert {"numpy", "starlette", "google", "grpc", "hpack"} <= IMPORTS.keys()
    assert IMPORTS["torch"]["module"] == set() and IMPORTS["torch"]["lazy"]


@pytest.mark.parametrize("name", sorted(IMPORTS))
def test_every_imported_library_is_declared(name: str) -> None:
    distribution = normalise(DISTRIBUTION_OF.get(name, name))
    where = IMPORTS[name]
    if where["module"]:
        assert distribution in BASE, (
            f"{name} (distribution {distribution!r}) is imported at module level by "
            f"{', '.join(sorted(where['module']))} but is not in pyproject.toml's [project] dependencies"
        )
    else:
        extras = sorted(extra for extra, names in EXTRAS.items() if distribution in names)
        assert distribution in BASE or extras, (
            f"{name} (distribution {distribution!r}) is imported by {', '.join(sorted(where['lazy']))} "
            "but is declared neither in [project] dependencies nor in an optional extra"
        )


def test_the_name_mapping_has_no_stale_rows() -> None:
    assert set(DISTRIBUTION_OF) <= IMPORTS.keys(), "DISTRIBUTION_OF names a library server/nereid no longer imports"
