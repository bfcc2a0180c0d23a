"""What the benchmarks share, so that each one measures the same way:

- `bench.common.cpu`: CPU seconds a process (and its children) has used, from /proc;
- `bench.common.raw_forwarder`: the baseline proxy, bytes in and bytes out (`python -m
  bench.common.raw_forwarder`);
- `bench.common.setup`: real Kafka and real Sluice processes, and topics on them (the test
  harness's, `tests/harness/`: the benchmarks and the tests start them alike);
- `bench.common.results`: where a run happened (commit, machine, load) and its result files and
  charts.

No benchmark imports a test module: what a benchmark shares with the tests lives in `tests/harness/`
and reaches the benchmarks through `bench.common.setup`.
"""
