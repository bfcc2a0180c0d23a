"""A child process's output, read line by line on a thread of its own."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO


def read_lines(stream: IO[str], on_line: Callable[[str], None], keep: Path | None = None) -> threading.Thread:
    """Hand each line of `stream` to `on_line` until the end, then close the stream. A pipe left
    open would be collected later, inside whatever test runs then, as a ResourceWarning. `keep`:
    a file each line is appended to as it comes (kept after the test, for a post-mortem). Join the
    thread (after the process has exited) to know every line has been handed over."""

    def run() -> None:
        with stream, (open(keep, "a") if keep is not None else contextlib.nullcontext()) as kept:
            for line in stream:
                if kept is not None:
                    kept.write(line)
                    kept.flush()
                on_line(line)

    thread = threading.Thread(target=run, name="child-output", daemon=True)
    thread.start()
    return thread
