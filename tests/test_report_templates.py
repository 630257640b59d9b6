"""Report pages come from jinja2 templates shipped in the wheel: a template missing from the package data fails
here, as it would in CI's wheel; user text is escaped, fragments the page built are kept as HTML."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from vitscope.report.html import page
from vitscope.report.index import write_index
from vitscope.report.render import trusted

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "src" / "vitscope" / "report" / "templates"

# rendered with only the installed package on the path, templates read through importlib.resources
FROM_WHEEL = """
import importlib.resources, sys
import vitscope.report
from vitscope.report.html import page
from vitscope.report.render import trusted
shipped = sorted(p.name for p in (importlib.resources.files("vitscope.report") / "templates").iterdir())
print(",".join(shipped))
html = page("wheel <check>", trusted(["<h1>from the wheel</h1>"])).decode()
assert "<h1>from the wheel</h1>" in html and "<title>wheel &lt;check&gt;</title>" in html, html
assert ".opening{" in html  # the style sheet came along
print(vitscope.report.__file__)
"""


def test_the_wheel_ships_every_template_and_renders_a_page_from_it(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, text=True, timeout=600)
    wheel = next((tmp_path / "dist").glob("vitscope-*.whl"))
    installed = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    out = subprocess.run([sys.executable, "-c", FROM_WHEEL], cwd=tmp_path, env={"PYTHONPATH": str(installed),
                         "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    shipped, where = out.stdout.split()
    assert shipped.split(",") == sorted(p.name for p in TEMPLATES.iterdir() if p.is_file())
    assert where.startswith(str(installed))


def test_user_text_is_escaped_and_built_fragments_are_kept(tmp_path):
    built = page("model <b>x</b>", [*trusted(["<h2>Runs</h2>"]), "a <script> label"]).decode()
    assert "<title>model &lt;b&gt;x&lt;/b&gt;</title>" in built
    assert "<h2>Runs</h2>" in built and "a &lt;script&gt; label" in built and "<script>" not in built
    name = 'a"<b>'
    (tmp_path / name).mkdir()
    (tmp_path / name / "report.html").write_text("<html></html>")
    index = write_index(tmp_path, {name: "Title <i>x</i>", "missing": "Not <u>run</u>"}).read_text()
    assert 'href="a&#34;&lt;b&gt;/report.html">Title &lt;i&gt;x&lt;/i&gt;</a>' in index
    assert "Not &lt;u&gt;run&lt;/u&gt;: not run yet (<code>vitscope demo missing</code>)" in index
    assert "<b>" not in index and "<i>" not in index
