#!/usr/bin/env bash
# Builds the guest-side tool components (wasm32-wasip2) and copies them to artifacts/guests/.
# Idempotent and incremental: cargo rebuilds only what changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BRIG_ARTIFACTS:-$root/artifacts}/guests"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
target_dir="${CARGO_TARGET_DIR:-$root/wasm-guests/target}"
(cd "$root/wasm-guests" && CARGO_TARGET_DIR="$target_dir" cargo build --release --target wasm32-wasip2 --quiet)
mkdir -p "$out/tools" "$out/testing"
built="$target_dir/wasm32-wasip2/release"
for tool in files grep patch jq; do
    install -m 0644 "$built/brig_tool_$tool.wasm" "$out/tools/$tool.wasm"
done
install -m 0644 "$built/chaos.wasm" "$out/testing/chaos.wasm"
echo "guest components in $out"
