#!/usr/bin/env bash
# Build grepplabs kafka-proxy v0.4.3 (commit 317f1d7aca20d80a341a11235d615b185857d9d6) into
# bench/peers/build/kafka-proxy (or $PEERS_BUILD/kafka-proxy): the binary `kafka-proxy` and `start.sh`.
#
# First `go install github.com/grepplabs/kafka-proxy@v0.4.3` (GOBIN = the build dir), when the Go
# module proxy serves it. Where it does not (some mirrors refuse the module), build from a source
# checkout instead:
#   KAFKA_PROXY_SRC=/path   a v0.4.3 source tree (with go.mod and vendor/), or a git repository
#                           (bare or not) of github.com/grepplabs/kafka-proxy that has the tag v0.4.3
# The tag ships vendor/, so the source build downloads nothing. go.mod says `go 1.23`.
# Needs: Go >= 1.23 (`go` on PATH, or GO=/path/to/go). A cold build takes minutes (-p 1, nice:
# the benchmark machine is small and shared).
set -euo pipefail
SRC="$(cd "$(dirname "$0")" && pwd)"
VERSION=v0.4.3
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
BUILD_ROOT="${PEERS_BUILD:-$SRC/../build}"
mkdir -p "$BUILD_ROOT"
OUT="$(cd "$BUILD_ROOT" && pwd)/kafka-proxy"
mkdir -p "$OUT"
rm -f "$OUT/kafka-proxy"
cp "$SRC/start.sh" "$OUT/start.sh"
chmod +x "$OUT/start.sh"

if GOBIN="$OUT" nice -n 10 "$GO" install -p 1 "github.com/grepplabs/kafka-proxy@$VERSION"; then
  echo "built with go install"
elif [ -n "${KAFKA_PROXY_SRC:-}" ]; then
  echo "go install failed; building from KAFKA_PROXY_SRC=$KAFKA_PROXY_SRC"
  if [ -f "$KAFKA_PROXY_SRC/go.mod" ]; then
    TREE="$KAFKA_PROXY_SRC"
  else  # a git repository: check the tag out into the build dir
    TREE="$OUT/src"
    rm -rf "$TREE" && mkdir -p "$TREE"
    git --git-dir="$(git -C "$KAFKA_PROXY_SRC" rev-parse --absolute-git-dir)" archive "$VERSION" | tar -x -C "$TREE"
  fi
  (cd "$TREE" && nice -n 10 "$GO" build -p 1 -o "$OUT/kafka-proxy" .)
else
  echo "go install github.com/grepplabs/kafka-proxy@$VERSION failed, and KAFKA_PROXY_SRC is not set:" >&2
  echo "  rerun with KAFKA_PROXY_SRC=/path/to/a/kafka-proxy/checkout (tag $VERSION)" >&2
  exit 1
fi
"$OUT/kafka-proxy" server --help >/dev/null
echo "kafka-proxy ready: $OUT/kafka-proxy"
