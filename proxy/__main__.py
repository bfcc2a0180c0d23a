import sys

# kio imports Hypothesis whenever it is installed (for test strategies of its own), which the server
# never uses: refusing it saves each process start (the server, each worker, the access-log writer)
# about 0.13 s of CPU where the dev dependencies are installed. Without them this changes nothing.
sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]

from proxy.cli import main  # noqa: E402

if __name__ == "__main__":  # not when a spawned child (the access-log writer) imports it as __mp_main__
    main()
