"""Run Sluice under cProfile on a CPU-time clock, so idle waits in the event loop do not count.

`python -m bench.profile_sluice OUT.prof proxy --config FILE` is `python -m proxy proxy --config
FILE` with the profile dumped to OUT.prof when Sluice exits (SIGTERM drains, then exits). The
benchmark's `--profile-sluice` uses it. cProfile's per-call overhead inflates functions that are
called often; read the result for *where* CPU goes, and the benchmark's unprofiled CPU per MB for
*how much*.
"""

from __future__ import annotations

import cProfile
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m bench.profile_sluice OUT.prof proxy --config FILE", file=sys.stderr)
        return 2
    out, args = argv[0], argv[1:]
    from proxy.cli import main as cli

    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(cli.main, args=args, prog_name="sluice")
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
