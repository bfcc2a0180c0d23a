"""The README's and docs' samples are safe to copy and their links stay inside the repository
(issue 14)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def yaml_blocks() -> list[str]:
    return [block for path in DOCS
            for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), flags=re.S)]


def test_no_sample_makes_anonymous_an_admin() -> None:
    admins = []
    for block in yaml_blocks():
        for match in re.finditer(r"^admins:.*$", block, flags=re.M):
            value = yaml.safe_load(match.group(0).split("#", 1)[0])["admins"]
            admins.append(value)
            assert "ANONYMOUS" not in value, match.group(0)
    assert admins, "the docs show an admins sample"


def test_links_stay_inside_the_repository_and_exist() -> None:
    for path in DOCS:
        text = path.read_text()
        assert "../shared" not in text, path
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{path.name} links {target}, outside the repository"
            assert resolved.exists(), f"{path.name} links {target}, which is not in the repository"
    assert "docs/kafka-quota-semantics.md" in README
    for doc in ("operating", "quotas", "fleet", "analytics", "security", "configuration", "benchmarks"):
        assert f"(docs/{doc}.md)" in README, f"the README points to docs/{doc}.md"
