"""The README is a landing page and the docs are by task (issue 28): it stays short, and its
folder table names every part of the proxy (it once lacked `fleet/` and `workers/`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAX_README_LINES = 250


def test_the_readme_is_a_landing_page() -> None:
    lines = README.count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: the reference belongs in docs/"


def test_the_folder_table_names_every_package_of_the_proxy() -> None:
    packages = sorted(p.parent.name for p in (ROOT / "proxy").glob("*/__init__.py"))
    assert {"pumps", "workers", "fleet"} <= set(packages)
    missing = [name for name in packages if f"`proxy/{name}/`" not in README]
    assert not missing, f"README.md's folder table does not name {missing}"
