"""The README's samples are safe to copy and its links stay inside the repository (issue 14)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", README, flags=re.S)


def test_no_sample_makes_anonymous_an_admin() -> None:
    admins = []
    for block in yaml_blocks():
        for match in re.finditer(r"^admins:.*$", block, flags=re.M):
            value = yaml.safe_load(match.group(0).split("#", 1)[0])["admins"]
            admins.append(value)
            assert "ANONYMOUS" not in value, match.group(0)
    assert admins, "the README shows an admins sample"


def test_links_stay_inside_the_repository_and_exist() -> None:
    assert "../shared" not in README
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README):
        assert not target.startswith(".."), target
        assert (ROOT / target).exists(), f"README links {target}, which is not in the repository"
    assert "docs/kafka-quota-semantics.md" in README
