#!/usr/bin/env bash
# Start grepplabs kafka-proxy v0.4.3 as a plain passthrough proxy in the foreground.
#   LISTEN_PORT      port the proxy listens on for the (first) bootstrap broker (127.0.0.1)
#   KAFKA_BOOTSTRAP  target cluster bootstrap, e.g. 127.0.0.1:9092; a comma list maps the i-th
#                    broker address to 127.0.0.1:(LISTEN_PORT+i)
#   KAFKA_PROXY_ARGS (optional): extra flags appended, e.g. --log-level=warning
# Brokers that appear in metadata but are not in KAFKA_BOOTSTRAP get a dynamic listener on a
# random 127.0.0.1 port. The HTTP (metrics/health) listener is disabled; the debug listener is
# off by default.
set -euo pipefail
: "${LISTEN_PORT:?set LISTEN_PORT}"
: "${KAFKA_BOOTSTRAP:?set KAFKA_BOOTSTRAP}"
HERE="$(cd "$(dirname "$0")" && pwd)"
args=()
i=0
IFS=',' read -r -a addrs <<< "$KAFKA_BOOTSTRAP"
for a in "${addrs[@]}"; do
  args+=(--bootstrap-server-mapping "${a},127.0.0.1:$((LISTEN_PORT + i))")
  i=$((i + 1))
done
exec "$HERE/kafka-proxy" server \
  "${args[@]}" \
  --default-listener-ip 127.0.0.1 \
  --http-disable \
  ${KAFKA_PROXY_ARGS:-}
