#!/usr/bin/env bash
# Builds the third-party suite aldehir/llm-serving-tests (Go; the `llm-serve-test` binary) for
# bench/llm-serving-tests.mjs, offline, with Debian's Go. Prints the binary's path on its last line.
#
#   bash bench/build-llm-serving-tests.sh SRC_DIR [OUT_BIN]
#
# SRC_DIR: a checkout of https://github.com/aldehir/llm-serving-tests (measured at b29b5ad, 2026-02-21).
# OUT_BIN: default ${KEEL_CACHE_DIR:-~/.cache/keel}/llm-serving-tests/llm-serve-test.
#
# Why not `go build` as its README says: the suite's go.mod asks for Go 1.24 and fetches its seven modules (cobra,
# pflag, fatih/color, go-colorable, go-isatty, mousetrap, x/sys) from the Go proxy. Without the network and with
# Debian 12's Go 1.19 this script instead
#   1. takes the modules from Debian's source packages (apt-get install golang-go golang-github-spf13-cobra-dev
#      golang-github-spf13-pflag-dev golang-github-fatih-color-dev golang-github-mattn-go-colorable-dev
#      golang-github-mattn-go-isatty-dev golang-golang-x-sys-dev golang-github-inconshreveable-mousetrap-dev;
#      older versions than go.sum pins, same APIs for what the suite calls) in GOPATH mode (GO111MODULE=off);
#   2. rewrites the suite's two Go 1.22 `range over an int` loops (runner.go's worker pool, agentic_long.go's
#      iteration cap) into classic for loops, in a copy: no test changes what it sends or checks.
# With Go >= 1.22 and the proxy reachable, `go build -o BIN ./cmd/llm-serve-test` in SRC_DIR gives the same binary.
set -euo pipefail

SRC="${1:?usage: bash bench/build-llm-serving-tests.sh SRC_DIR [OUT_BIN]}"
OUT="${2:-${KEEL_CACHE_DIR:-$HOME/.cache/keel}/llm-serving-tests/llm-serve-test}"
NICE="${NICE:-15}"
[ -f "$SRC/cmd/llm-serve-test/main.go" ] || { echo "$SRC is not an llm-serving-tests checkout" >&2; exit 1; }
command -v go >/dev/null || { echo "no go: apt-get install -y golang-go (and the golang-*-dev packages above)" >&2; exit 1; }

# 1. A GOPATH tree holding a copy of the source under its import path.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PKG="$WORK/gopath/src/github.com/aldehir/llm-serving-tests"
mkdir -p "$(dirname "$PKG")"
cp -r "$SRC" "$PKG"
rm -rf "$PKG/.git"

# 2. Go 1.19 compatibility: range over an int is Go 1.22.
sed -i 's/for range r\.config\.Jobs {/for w := 0; w < r.config.Jobs; w++ {/' "$PKG/internal/eval/runner.go"
sed -i 's/for i := range maxIterations {/for i := 0; i < maxIterations; i++ {/' "$PKG/internal/eval/agentic_long.go"

# 3. Build against Debian's packaged modules.
mkdir -p "$(dirname "$OUT")"
(cd "$PKG" && GO111MODULE=off GOFLAGS= GOPATH="$WORK/gopath:/usr/share/gocode" GOCACHE="$WORK/cache" \
  nice -n "$NICE" go build -o "$OUT" ./cmd/llm-serve-test) >&2
echo "$OUT"
