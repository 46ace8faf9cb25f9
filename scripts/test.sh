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
# The layering test reads `cargo metadata --offline`, which needs every locked crate, also
# those only other targets build (a fresh machine's build never downloads them).
echo "[test] cargo fetch"
cargo fetch --quiet
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
# The chaos test runs brigd as nodes run it: the release build, with its shim and lazy server.
release=(cargo build --release -p brigd -p brig-container -p brig-images --bins --quiet)
if cargo nextest --version >/dev/null 2>&1 && [[ $# -eq 0 ]]; then
    # From empty that build takes about 11 minutes of both cores. It runs at the lowest priority
    # beside the suite (whose emulated hosts take their turns one at a time and leave a core
    # mostly idle), and the chaos test runs once it is done.
    release_log="$(mktemp)"
    nice -n 19 "${release[@]}" >"$release_log" 2>&1 &
    release_pid=$!
    trap 'kill "$release_pid" 2>/dev/null || true; rm -f "$release_log"' EXIT
    status=0
    cargo nextest run --workspace --no-fail-fast --failure-output final \
        -E 'not binary_id(brig-tests::chaos)' || status=$?
    echo "[test] waiting for the release build (chaos test)"
    if ! wait "$release_pid"; then
        cat "$release_log"
        exit 1
    fi
    cargo nextest run --workspace --failure-output final -E 'binary_id(brig-tests::chaos)' ||
        status=$?
    [[ $status -eq 0 ]] || exit "$status"
    cargo test --workspace --doc --quiet
elif cargo nextest --version >/dev/null 2>&1; then
    "${release[@]}"
    cargo nextest run --workspace --no-fail-fast --failure-output final "$@"
    cargo test --workspace --doc --quiet
else
    "${release[@]}"
    cargo test --workspace --no-fail-fast "$@"
fi
# Every fuzz target for a few seconds on its corpus (nightly; after the suite: one build at a
# time on two cores).
if [[ $# -eq 0 ]]; then
    echo "[test] fuzz targets"
    "$root/scripts/fuzz.sh"
fi
# The hostile-agent suite's report: every attempt and its outcome.
for report in artifacts/reports/hostile-*.md; do
    [[ -f $report ]] && cat "$report" && echo
done
echo "[test] all tests passed"
