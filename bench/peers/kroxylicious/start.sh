#!/usr/bin/env bash
# Start Kroxylicious 0.12.0 as a plain passthrough proxy (no filters) in the foreground.
#   LISTEN_PORT      bootstrap port the proxy listens on (127.0.0.1)
#   KAFKA_BOOTSTRAP  target cluster bootstrap, e.g. 127.0.0.1:9092 (comma list allowed)
#   NODE_ID_START / NODE_ID_END (optional, default 0 / 5): broker node ids the proxy exposes;
#     node id N is served on 127.0.0.1:(LISTEN_PORT + 1 + N - NODE_ID_START), so ports
#     LISTEN_PORT .. LISTEN_PORT+1+(END-START) must be free.
#   JAVA (optional): java binary, default `java` on PATH (Java 17+).
#   KROXY_JAVA_OPTS (optional): extra JVM flags, appended.
set -euo pipefail
: "${LISTEN_PORT:?set LISTEN_PORT}"
: "${KAFKA_BOOTSTRAP:?set KAFKA_BOOTSTRAP}"
NODE_ID_START="${NODE_ID_START:-0}"
NODE_ID_END="${NODE_ID_END:-5}"
HERE="$(cd "$(dirname "$0")" && pwd)"
RUN_DIR="${KROXY_RUN_DIR:-$HERE/run}"
mkdir -p "$RUN_DIR"
CONFIG="$RUN_DIR/proxy-config-${LISTEN_PORT}.yaml"
cat > "$CONFIG" <<YAML
virtualClusters:
  - name: bench
    targetCluster:
      bootstrapServers: ${KAFKA_BOOTSTRAP}
    gateways:
      - name: plain
        portIdentifiesNode:
          bootstrapAddress: 127.0.0.1:${LISTEN_PORT}
          nodeIdRanges:
            - name: brokers
              start: ${NODE_ID_START}
              end: ${NODE_ID_END}
    logNetwork: false
    logFrames: false
YAML
# JVM flags: what kroxylicious-start.sh/run-java.sh of the 0.12.0 distribution pass outside a
# container (default heap, i.e. no -Xms/-Xmx; async log4j2; exit on OOM).
exec "${JAVA:-java}" \
  -Dlog4j2.configurationFile="$HERE/config/log4j2.yaml" \
  -Dlog4j2.contextSelector=org.apache.logging.log4j.core.async.AsyncLoggerContextSelector \
  -XX:+ExitOnOutOfMemoryError \
  ${KROXY_JAVA_OPTS:-} \
  -cp "$HERE/classes:$HERE/lib/*" peers.KroxyliciousMain "$CONFIG"
