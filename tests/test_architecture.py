"""The house's shape (docs/architecture.md): rooms that import downwards only, none too large to read at once,
and a configuration resolved at the edge."""

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "algorithms", "bench")
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The project's modules a module imports, at its top or inside a function (a lazy import is a dependency too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            # `from tuner.settings import papers` depends on tuner.settings.papers, not on tuner's __init__
            names = submodules or [node.module]
        out |= {n for n in names if n in known}
    return out


def test_no_module_imports_one_that_imports_it_back():
    found = modules()
    graph = {name: imports(path, set(found)) - {name} for name, path in found.items()}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"import circle: {' -> '.join(e.args[1])}") from None


def test_no_module_is_longer_than_a_reader_takes_in_at_once():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_function_is_longer_than_80_lines_but_a_commands_option_list():
    """A function a reader takes in at once; a command of tuner/cli/ is long by its options, one a parameter."""
    long = {}
    for name, path in modules().items():
        if name.startswith("tuner.cli."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    assert not long, long


def test_a_methods_docstring_states_no_measured_accuracy():
    """Measured results live in the pages that a test holds to committed runs (docs/reproduction.md,
    docs/methods.md); a method's docstring points there, since a figure written in code is held by nothing."""
    figures = {
        name: found
        for name, path in modules().items()
        if name.startswith("algorithms.")
        and (found := re.findall(r"\b\d{2}\.\d{2}\b", ast.get_docstring(ast.parse(path.read_text())) or ""))
    }
    assert not figures, figures


def test_no_test_file_is_longer_than_700_lines():
    """Tests split by concern: a file a reader can hold, one subject each."""
    long = {p.name: n for p in (ROOT / "tests").glob("*.py") if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long


def test_a_configuration_is_resolved_in_two_places_at_most():
    calls = [
        f"{name}:{i}"
        for name, path in modules().items()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.resolved\(\)", line) and not line.lstrip().startswith("#")
    ]
    assert len(calls) <= 2, calls


def test_the_map_names_every_module():
    """docs/architecture.md names every module by its path (a package by its folder's files), and every path it
    names exists; a method's own module is covered by its `algorithms/NAME.py` row."""
    import algorithms

    page = (ROOT / "docs" / "architecture.md").read_text()
    methods = {cls.__module__ for cls in algorithms.METHODS.values()} - {"algorithms.base"}
    unnamed = []
    for name, path in modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if name in methods:
            continue
        folder, file = rel.rsplit("/", 1)
        inside = rel.split("/", 1)[1]  # sweep/console.py, under the map's tuner/sweep/
        bare = re.search(rf"(?<![\w/]){re.escape(file)}\b", page)  # run.py, in a list of tuner/cli/'s files
        if rel not in page and not (f"{folder}/" in page and (inside in page or bare)):
            unnamed.append(rel)
    assert not unnamed, f"modules docs/architecture.md does not name: {unnamed}"
    named = set(re.findall(r"\b((?:tuner|algorithms|bench)/[\w/]+\.py)\b", page)) - {"algorithms/NAME.py"}
    assert not [p for p in named if not (ROOT / p).exists()], "the map names modules that do not exist"


def test_the_commands_load_on_a_node_without_ray_or_optuna(tmp_path):
    """A GPU node may have torch alone: `tuner run`, `tuner report` and the bench import neither Ray nor Optuna until
    a sweep is read or built (the GPU campaign's miniature run holds the whole path; this is its quick form)."""
    import os
    import subprocess
    import sys

    for name in ("ray", "optuna"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed on this node')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    code = "import tuner.cli, tuner.report.write, tuner.federated_run"
    loaded = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-1500:]
