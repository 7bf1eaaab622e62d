#!/usr/bin/env bash
# Builds the airlock-os wheel into DIR (default dist/): the airlock CLI, packaged by maturin
# (bindings = "bin"), plus airlock-mcp, staged into the wheel's scripts directory here because
# maturin packages the binaries of one crate only. Both land side by side in the environment's
# bin/ on install, which is where airlock-mcp looks for the airlock binary it runs as init.
# Needs cargo and maturin (pip install maturin).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "${1:-$here/dist}")"
cd "$here"
cargo build --release --locked -p airlock-mcp --manifest-path ../../Cargo.toml
target="$(cargo metadata --format-version 1 --no-deps --manifest-path ../../Cargo.toml \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
rm -rf data
mkdir -p data/scripts
install -m 0755 "$target/release/airlock-mcp" data/scripts/airlock-mcp
"${MATURIN:-maturin}" build --release --locked --out "$out"
rm -rf data
