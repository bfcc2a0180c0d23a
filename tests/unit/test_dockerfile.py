"""The Dockerfile checked statically: hadolint, plus the properties operators rely on (slim base by
default, non-root user, uvloop installed, exec-form entrypoint, healthcheck on the metrics port the
image sets). tests/deploy/test_image.py builds and runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

DOCKERFILE = Path(__file__).resolve().parents[2] / "Dockerfile"


@pytest.fixture(scope="module")
def parsed() -> DockerfileParser:
    return DockerfileParser(path=str(DOCKERFILE))


def instructions(parsed: DockerfileParser, name: str) -> list[str]:
    return [i["value"] for i in parsed.structure if i["instruction"] == name]


def final_stage(parsed: DockerfileParser) -> list[dict[str, str]]:
    starts = [n for n, i in enumerate(parsed.structure) if i["instruction"] == "FROM"]
    return parsed.structure[starts[-1]:]


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_base_image_is_slim_python_311_unless_a_build_arg_says_otherwise(parsed: DockerfileParser) -> None:
    assert instructions(parsed, "ARG") == ["BASE_IMAGE=python:3.11-slim"]
    assert [v.split()[0] for v in instructions(parsed, "FROM")] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert parsed.baseimage == "python:3.11-slim"  # what `docker build .` uses


def test_runs_as_a_non_root_user(parsed: DockerfileParser) -> None:
    users = [i["value"] for i in final_stage(parsed) if i["instruction"] == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"}


def test_entrypoint_is_exec_form_sluice(parsed: DockerfileParser) -> None:
    entrypoint = instructions(parsed, "ENTRYPOINT")[-1]
    assert json.loads(entrypoint) == ["sluice"]  # exec form: sluice is PID 1 and receives SIGTERM
    assert json.loads(instructions(parsed, "CMD")[-1])[0] == "proxy"
    assert instructions(parsed, "STOPSIGNAL") == ["SIGTERM"]


def test_healthcheck_probes_the_metrics_port_the_image_sets(parsed: DockerfileParser) -> None:
    (health,) = instructions(parsed, "HEALTHCHECK")
    assert "http://127.0.0.1:%s/healthz' % os.environ['SLUICE_METRICS__PORT']" in health
    env = dict(pair.split("=", 1) for value in instructions(parsed, "ENV") for pair in value.split())
    assert env["SLUICE_METRICS__PORT"] == "9404" and env["SLUICE_METRICS__HOST"] == "0.0.0.0"
    assert env["SLUICE_METRICS__PORT"] in instructions(parsed, "EXPOSE")[0].split()


def test_image_installs_the_package_with_uvloop(parsed: DockerfileParser) -> None:
    runs = " ".join(instructions(parsed, "RUN"))
    assert "pip install" in runs and " ." in runs
    pyproject = (DOCKERFILE.parent / "pyproject.toml").read_text()
    assert '"uvloop==' in pyproject.split("[project.optional-dependencies]")[0]
