"""The layering is a checked contract: import-linter's layers contract (pyproject.toml), and no import circle."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_go_one_way():
    pytest.importorskip("importlinter")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()", "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout


def test_no_import_circle_between_modules():
    grimp = pytest.importorskip("grimp")
    sys.path.insert(0, str(ROOT / "src"))
    graph = grimp.build_graph("vitscope", cache_dir=None)
    packages = {m for m in graph.modules if graph.find_children(m)}
    circles = []
    for module in sorted(graph.modules - packages):  # a package's __init__ importing its own modules is no circle
        for imported in graph.find_modules_directly_imported_by(module) - packages:
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append(" -> ".join((module, *back)))
    assert not circles, "import circles:\n" + "\n".join(circles)
