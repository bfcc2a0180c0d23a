#!/usr/bin/env bash
# Build both peer proxies for bench/bench_peers.py into bench/peers/build/ (or $PEERS_BUILD):
# Kroxylicious 0.12.0 (Maven) and grepplabs kafka-proxy v0.4.3 (Go). Pass KAFKA_PROXY_SRC=/path when
# the Go module proxy does not serve kafka-proxy (see kafka-proxy/setup.sh). Either build may fail
# on its own: the benchmark runs the peers that are built.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
status=0
"$HERE/kroxylicious/setup.sh" || { echo "kroxylicious setup FAILED" >&2; status=1; }
"$HERE/kafka-proxy/setup.sh" || { echo "kafka-proxy setup FAILED" >&2; status=1; }
exit $status
