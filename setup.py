"""Builds the compiled data plane (protocol/_speedups.pyx, the access log's walks in
protocol/_log_speedups.pyx, a connection's response side in proxy/pumps/_speedups.pyx, the quota
stage's hooks in proxy/stages/_speedups.pyx, the access log's capture in proxy/ops/_speedups.pyx),
the quota stats (quotas/_speedups.pyx) and the replay's loop (quotas/_replay_speedups.pyx), with
Cython, when it can. The two byte-path modules cimport the inline helpers of protocol/_walk.pxd, and
protocol/_speedups.pyx, quotas/_speedups.pyx and the three proxy/*/_speedups.pyx those of
protocol/_slots.pxd (a change to a .pxd rebuilds the modules that cimport it).

Everything else is in pyproject.toml. The extension is optional: without a C compiler (or without
Cython) `pip install` still succeeds, says so clearly, and Sluice runs its pure-Python data plane,
the readable reference the compiled one is tested against. At run time SLUICE_PURE_PYTHON=1 selects
the pure path even when the extension is built (`protocol.fastpath`).

SLUICE_PREBUILT_EXTENSIONS names a directory of extensions built before from the same sources (laid
out as `protocol/_speedups.cpython-311-x86_64-linux-gnu.so`, ...): `scripts/setup` keeps them per
machine by a hash of their sources, setup.py and the interpreter, and a set-up that finds them copies
them in instead of compiling again.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

_NO_EXTENSION = """
********************************************************************************
Sluice: the compiled data plane (protocol._speedups) was NOT built: {reason}
Sluice still works: it runs the pure-Python data plane, which uses more CPU per
request. To build it, install a C compiler and the Python headers (Debian/Ubuntu:
`apt-get install gcc python3-dev`) and run `pip install -e .` again.
********************************************************************************
"""


def _say_no_extension(reason: str) -> None:
    print(_NO_EXTENSION.format(reason=reason), file=sys.stderr)


class OptionalBuildExt(build_ext):
    """build_ext that turns a missing compiler into a message instead of a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # DistutilsPlatformError and friends: no compiler at all
            _say_no_extension(f"{type(exc).__name__}: {exc}")

    def build_extension(self, ext: Extension) -> None:
        built = _prebuilt(self.get_ext_filename(ext.name))
        if built is not None:
            target = Path(self.get_ext_fullpath(ext.name))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(built, target)
            return
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a compiler that is not there
            _say_no_extension(f"{type(exc).__name__}: {exc}")


def _prebuilt(filename: str) -> Path | None:
    """The extension `filename` (relative, e.g. protocol/_speedups.cpython-311-...so) in the
    SLUICE_PREBUILT_EXTENSIONS directory, if that is set and holds it."""
    directory = os.environ.get("SLUICE_PREBUILT_EXTENSIONS")
    path = Path(directory) / filename if directory else None
    return path if path is not None and path.is_file() else None


def _extensions() -> list[Extension]:
    extensions = [
        Extension("protocol._speedups", ["protocol/_speedups.pyx"]),
        Extension("protocol._log_speedups", ["protocol/_log_speedups.pyx"]),  # the access log's walks
        Extension("quotas._speedups", ["quotas/_speedups.pyx"]),
        # a connection's response side (proxy/pumps/responses.py's twin)
        Extension("proxy.pumps._speedups", ["proxy/pumps/_speedups.pyx"]),
        Extension("proxy.stages._speedups", ["proxy/stages/_speedups.pyx"]),  # the quota stage's hooks
        Extension("proxy.ops._speedups", ["proxy/ops/_speedups.pyx"]),  # the access log's capture
        # the replay's loop (quotas/replay_loop.py's twin): its float arithmetic must be the
        # reference's, operation for operation, so no fused multiply-adds
        Extension("quotas._replay_speedups", ["quotas/_replay_speedups.pyx"],
                  extra_compile_args=["-ffp-contract=off"])]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if all(_prebuilt(ext.name.replace(".", "/") + suffix) for ext in extensions):
        return extensions  # copied in by OptionalBuildExt: nothing to translate
    try:
        from Cython.Build import cythonize
    except ImportError:
        _say_no_extension("Cython is not installed (it is a build requirement in pyproject.toml)")
        return []
    return cythonize(extensions, compiler_directives={"language_level": "3"}, quiet=True)


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
