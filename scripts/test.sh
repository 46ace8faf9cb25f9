#!/usr/bin/env bash
# Runs every test: installs what is missing, builds guest artifacts and binaries, checks format
# and lints, then runs the unit and integration tests (real brigd processes on loopback).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
"$root/scripts/install-deps.sh"
"$root/scripts/build-guests.sh"
"$root/scripts/build-images.sh"
"$root/scripts/build-vm-guests.sh"
"$root/scripts/build-fullvm-image.sh"
echo "[test] cargo fmt --check"
cargo fmt --all --check
echo "[test] cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "[test] building binaries"
cargo build --workspace --bins --quiet
echo "[test] building the Python SDK into artifacts/venv (maturin develop)"
VIRTUAL_ENV="$root/artifacts/venv" "$root/artifacts/venv/bin/maturin" develop --quiet \
    -m "$root/sdk/python/Cargo.toml"
echo "[test] running tests"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast --failure-output final "$@"
    cargo test --workspace --doc --quiet
else
    cargo test --workspace --no-fail-fast "$@"
fi
# The hostile-agent suite's report: every attempt and its outcome.
for report in artifacts/reports/hostile-*.md; do
    [[ -f $report ]] && cat "$report" && echo
done
echo "[test] all tests passed"
