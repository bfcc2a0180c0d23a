"""Sluice's container image, built and run with Debian's own tools and no registry.

* the base: `scripts/image-base` (a debootstrapped bookworm with Python 3.11, in podman's store,
  cached by a hash of the script);
* the image: the repository's Dockerfile, `buildah bud --isolation chroot --format docker` with
  `--build-arg BASE_IMAGE=<that base>`; the host's CA bundle is mounted read-only for the RUN steps
  (pip), not copied into the image. With `--layers`: a rebuild reuses the layers whose inputs did not
  change (the dependencies, the compiled extensions). Tagged by a hash of the base and of every file
  the build reads, so a second run on an unchanged tree reuses it;
* a container: `podman run --runtime runc` (crun refuses this host's hybrid cgroups), the open-files
  limit at the hard limit, `--no-healthcheck` (podman schedules checks through systemd): a test
  runs the HEALTHCHECK command itself with `podman exec`.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

from tests.harness.kafka import REPO, _die_with_parent
from tests.harness.lines import read_lines
from tests.harness.wait import poll

TOOLS = ("podman", "buildah", "debootstrap", "runc")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def base_image() -> str:
    done = subprocess.run([str(REPO / "scripts" / "image-base")], capture_output=True, text=True,
                          timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _context_files() -> list[Path]:
    """What the build reads: the Dockerfile and its build stage's COPY sources."""
    parsed = DockerfileParser(path=str(REPO / "Dockerfile"))
    sources: list[str] = []
    for item in parsed.structure:
        if item["instruction"] == "COPY" and "--from" not in item["value"]:
            sources += item["value"].split()[:-1]
    files = [REPO / "Dockerfile"]
    for name in sources:
        for path in sorted(REPO.glob(name.rstrip("/"))):  # a name or a pattern (protocol/*.pyx)
            files += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if path.is_dir() else [path]
    return files


def build_image(base: str) -> str:
    digest = hashlib.sha256(base.encode())
    for path in _context_files():
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    tag = f"localhost/sluice:test-{digest.hexdigest()[:12]}"
    if subprocess.run(["podman", "image", "exists", tag], check=False, timeout=60).returncode == 0:
        return tag
    done = subprocess.run(
        ["buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers",
         "--build-arg", f"BASE_IMAGE={base}",
         "-v", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",    # pip's downloads trust what the host trusts
         "-t", tag, "-f", str(REPO / "Dockerfile"), str(REPO)],
        capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _remove_older(tag)
    return tag


def _remove_older(tag: str) -> None:
    """Earlier test builds (other trees' hashes) go: each is a few hundred MB in podman's store."""
    listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/sluice"],
                            capture_output=True, text=True, timeout=60, check=False).stdout.split()
    old = [name for name in listed if name.startswith("localhost/sluice:test-") and name != tag]
    if old:
        subprocess.run(["podman", "rmi", "--ignore", *old], capture_output=True, timeout=300, check=False)


def image_config(tag: str) -> dict[str, Any]:
    out = subprocess.run(["podman", "image", "inspect", tag], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return dict(json.loads(out)[0])


def runtime_flags() -> list[str]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard_s = str(hard) if hard != resource.RLIM_INFINITY else "1048576"
    return ["--runtime", "runc", "--ulimit", f"nofile={hard_s}:{hard_s}",
            "--ulimit", "nproc=32768:32768", "--no-healthcheck"]


class Container:
    """`podman run` in the foreground: its output is read here and its exit status is the container's."""

    def __init__(self, image: str, name: str, options: Sequence[str], env: Mapping[str, str],
                 command: Sequence[str], log_path: Path) -> None:
        self.image, self.name = image, name
        self.argv = ["podman", "run", "--rm", "--name", name, *runtime_flags(), *options,
                     *[f"--env={k}={v}" for k, v in env.items()], image, *command]
        self.log_path = log_path
        self.process: subprocess.Popen[str] | None = None
        self._lines: list[str] = []

    def start(self) -> Container:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, preexec_fn=_die_with_parent)
        assert self.process.stdout is not None
        read_lines(self.process.stdout, self._lines.append, keep=self.log_path)
        return self

    def log(self) -> str:
        return "".join(self._lines)

    def wait_for_log(self, text: str, timeout_s: float) -> bool:
        return poll(lambda: text in self.log(), timeout_s)

    def exec(self, *command: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", "exec", self.name, *command], capture_output=True, text=True,
                              timeout=timeout_s, check=False)

    def kill(self, signal_name: str) -> None:
        subprocess.run(["podman", "kill", "--signal", signal_name, self.name], capture_output=True,
                       timeout=60, check=False)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def remove(self) -> None:
        """Stop and remove the container whatever state it is in (a test's cleanup)."""
        if self.process is not None and self.process.poll() is None:
            subprocess.run(["podman", "rm", "-f", "-t", "5", self.name], capture_output=True, timeout=120,
                           check=False)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid)
