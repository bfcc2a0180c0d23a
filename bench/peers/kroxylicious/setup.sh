#!/usr/bin/env bash
# Build a runnable Kroxylicious 0.12.0 into bench/peers/build/kroxylicious (or $PEERS_BUILD/kroxylicious):
#   lib/      the runtime classpath, `mvn dependency:copy-dependencies` of pom.xml (Maven Central;
#             kroxylicious-app, the binary distribution, is not served there, hence our own main)
#   classes/  src/peers/KroxyliciousMain.java, compiled
#   config/   log4j2.yaml (as kroxylicious-app 0.12.0 ships it)
#   start.sh  the launcher (a copy of ./start.sh; it finds lib/, classes/, config/ next to itself)
# Needs: mvn, a JDK 17+ javac. Idempotent: reruns rebuild from scratch.
set -euo pipefail
SRC="$(cd "$(dirname "$0")" && pwd)"
BUILD_ROOT="${PEERS_BUILD:-$SRC/../build}"
mkdir -p "$BUILD_ROOT"
OUT="$(cd "$BUILD_ROOT" && pwd)/kroxylicious"
rm -rf "$OUT"
mkdir -p "$OUT/config"
cp "$SRC/pom.xml" "$OUT/pom.xml"
cp "$SRC/config/log4j2.yaml" "$OUT/config/log4j2.yaml"
cp "$SRC/start.sh" "$OUT/start.sh"
chmod +x "$OUT/start.sh"
cd "$OUT"
mvn -q -B dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime
javac -d classes -cp 'lib/*' "$SRC/src/peers/KroxyliciousMain.java"
echo "kroxylicious ready: $(ls lib | wc -l) jars in $OUT/lib, $OUT/classes/peers/KroxyliciousMain.class"
