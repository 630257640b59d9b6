"""Report pages rendered from the jinja2 templates in ``vitscope/report/templates`` (shipped as package data).

``base.html`` holds what every page shares (title, style sheet); ``study.html`` (a study's report: its sections in
order) and ``index.html`` (the demo's index) extend it. Autoescape is on: anything a page passes as text (model
labels, paths, study names) is escaped; an HTML fragment that a page built itself, escaping its own inputs, is
passed as ``Markup`` (``trusted``), explicitly.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup


@cache
def environment() -> jinja2.Environment:
    """The templates' environment (built on first use; templates read through importlib.resources)."""
    return jinja2.Environment(loader=jinja2.PackageLoader("vitscope.report", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined)


def render(template: str, **context: Any) -> bytes:
    """The page ``template`` rendered with ``context``, as UTF-8 bytes."""
    return environment().get_template(template).render(**context).encode()


def trusted(fragments: Iterable[str]) -> list[Markup]:
    """HTML fragments a page built itself (its inputs escaped where they were put in), marked safe."""
    return [Markup(fragment) for fragment in fragments]
