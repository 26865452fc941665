"""The Python examples of the JAX docs run as written (every ```python block of each page, in
order, in one namespace per page)."""

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
PAGES = [p for p in (DOCS / "jax.md", DOCS / "flax.md") if p.exists()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_examples_run(page):
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    assert blocks, f"{page} has no python example"
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
