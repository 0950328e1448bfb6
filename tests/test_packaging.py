"""What the code imports is what pyproject.toml declares: a package that only arrives through another's
requirements (pydantic through ray[tune]) is missing on a machine that installs the code's own list, as a bare
GPU node running bench/gpu_check.py does."""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# the project's packages, and the tests' helper modules beside them
OWN = {"tuner", "algorithms", "bench", "tests", "__future__"} | {p.stem for p in (ROOT / "tests").glob("*.py")}


def imported(folder: str) -> dict[str, str]:
    """Top-level modules imported anywhere under the folder (at any depth of the code), each with one file
    importing it."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return {m: p for m, p in found.items() if m not in OWN and m not in sys.stdlib_module_names}


def normalized(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_package_the_code_imports_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {normalized(r) for r in project["dependencies"]}
    tests = runtime | {normalized(r) for r in project["optional-dependencies"]["test"]}
    distributions = importlib.metadata.packages_distributions()
    for folders, declared in ((("tuner", "algorithms", "bench"), runtime), (("tests",), tests)):
        for folder in folders:
            for module, where in imported(folder).items():
                names = {normalized(d) for d in distributions.get(module, [module])}
                assert names & declared, (
                    f"{where} imports {module} ({', '.join(sorted(names))}), which pyproject.toml does not declare"
                )
