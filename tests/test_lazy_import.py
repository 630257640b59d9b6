"""`import vitscope`, then any documented path as an attribute chain: the sub-packages load on first access
(PEP 562, ``vitscope.lazy_import``), and the import itself loads nothing (no torch)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The sub-packages the README and docs name as the way in (a missing one, e.g. claims before it lands, is skipped).
DOCUMENTED = ["models", "data", "probes", "attention", "metrics", "stats", "claims", "record", "analyze", "train",
              "studies", "report", "explorer", "cli"]


def run_python(code: str) -> dict:
    """``code`` in a fresh interpreter with this tree first on the path; its last line of output, as JSON."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def documented_paths() -> list[str]:
    """Every ``vitscope.<module>...`` the README and docs/*.md write whose first part is one of vitscope's modules."""
    modules = {p.stem for p in (ROOT / "src" / "vitscope").iterdir() if p.suffix == ".py" or p.is_dir()}
    found = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for match in re.finditer(r"vitscope(?:\.[A-Za-z_]\w*)+", page.read_text()):
            if match.group(0).split(".")[1] in modules:
                found.add(match.group(0))
    return sorted(found)


def test_import_vitscope_then_a_subpackage_by_attribute_with_no_side_effects():
    code = """
import json, sys
import vitscope
clean = 'torch' not in sys.modules and not any(m.startswith('vitscope.') and m not in ('vitscope.version',
    'vitscope.lazy_import') for m in sys.modules)
model = vitscope.models.load('vit-micro')
print(json.dumps({'clean': clean, 'model': type(model).__name__, 'data': callable(vitscope.data.load_dataset)}))
"""
    assert run_python(code) == {"clean": True, "model": "VisionTransformer", "data": True}


def test_every_documented_path_resolves_after_import_vitscope():
    present = [name for name in DOCUMENTED if (ROOT / "src" / "vitscope" / name).is_dir()
               or (ROOT / "src" / "vitscope" / f"{name}.py").is_file()]
    assert {"models", "data", "probes", "attention", "metrics", "stats"} <= set(present)
    paths = sorted(set(documented_paths()) | {f"vitscope.{name}" for name in present})
    assert "vitscope.models.load" in paths and "vitscope.models.weights.hub" in paths  # the scan reads the docs
    code = f"""
import json, vitscope
failed = []
for path in {paths!r}:
    obj = vitscope
    try:
        for part in path.split('.')[1:]:
            obj = getattr(obj, part)
    except AttributeError as err:
        failed.append(f'{{path}}: {{err}}')
print(json.dumps(failed))
"""
    assert run_python(code) == []


def test_a_missing_name_is_still_an_attribute_error():
    code = """
import json, vitscope
out = []
for name in ('no_such_module', '_private'):
    try:
        getattr(vitscope.models, name)
    except AttributeError as err:
        out.append(str(err))
print(json.dumps(out))
"""
    assert run_python(code) == ["module 'vitscope.models' has no attribute 'no_such_module'",
                                "module 'vitscope.models' has no attribute '_private'"]
