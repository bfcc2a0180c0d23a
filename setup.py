"""Builds the compiled data plane (protocol/_speedups.pyx, the access log's walks in
protocol/_log_speedups.pyx, a connection's response side in proxy/pumps/_speedups.pyx), the quota
stats (quotas/_speedups.pyx) and the replay's loop (quotas/_replay_speedups.pyx), with Cython,
when it can. The two byte-path modules cimport the inline helpers of protocol/_walk.pxd (a change
there rebuilds both).

Everything else is in pyproject.toml. The extension is optional: without a C compiler (or without
Cython) `pip install` still succeeds, says so clearly, and Sluice runs its pure-Python data plane,
the readable reference the compiled one is tested against. At run time SLUICE_PURE_PYTHON=1 selects
the pure path even when the extension is built (`protocol.fastpath`).
"""

from __future__ import annotations

import sys

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
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a compiler that is not there
            _say_no_extension(f"{type(exc).__name__}: {exc}")


def _extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:
        _say_no_extension("Cython is not installed (it is a build requirement in pyproject.toml)")
        return []
    return cythonize(
        [Extension("protocol._speedups", ["protocol/_speedups.pyx"]),
         Extension("protocol._log_speedups", ["protocol/_log_speedups.pyx"]),  # the access log's walks
         Extension("quotas._speedups", ["quotas/_speedups.pyx"]),
         # a connection's response side (proxy/pumps/responses.py's twin)
         Extension("proxy.pumps._speedups", ["proxy/pumps/_speedups.pyx"]),
         # the replay's loop (quotas/replay_loop.py's twin): its float arithmetic must be the
         # reference's, operation for operation, so no fused multiply-adds
         Extension("quotas._replay_speedups", ["quotas/_replay_speedups.pyx"],
                   extra_compile_args=["-ffp-contract=off"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
