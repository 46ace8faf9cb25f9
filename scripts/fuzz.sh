#!/usr/bin/env bash
# Runs every coverage-guided fuzz target (fuzz/, cargo-fuzz on libFuzzer) for a short, bounded
# time on a copy of its corpus (fuzz/corpus/<target>): FUZZ_SECONDS each, 10 by default. A
# crash fails the run and leaves its input in fuzz/artifacts/<target>/. Installs what it needs
# and is missing: rustup's nightly toolchain (minimal) and cargo-fuzz from crates.io.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${FUZZ_SECONDS:-10}"

log() { printf '\033[1m[fuzz]\033[0m %s\n' "$*"; }

if ! rustup toolchain list | grep -q '^nightly'; then
    log "rustup toolchain install nightly (minimal)"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "cargo install cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi

cd "$root/fuzz"
# Its own target directory: nightly's and libFuzzer's builds share nothing with the stable one.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/brig-target}/fuzz"
export CARGO_INCREMENTAL=0
log "building the targets"
# No sanitizer: the targets are safe Rust (plus the VMM's audited unsafe), and CI's time is
# short; coverage guidance stays on.
cargo +nightly fuzz build -s none
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for target in $(cargo +nightly fuzz list); do
    mkdir -p "$work/$target"
    cp -r "corpus/$target/." "$work/$target/"
    log "$target: ${seconds}s from $(ls "corpus/$target" | wc -l) inputs"
    cargo +nightly fuzz run -s none "$target" "$work/$target" -- \
        -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 2>&1 |
        grep -E '^(stat::number_of_executed_units|stat::new_units_added)|Done|panicked|ERROR|SUMMARY' || true
    # The pipe hides libFuzzer's status: a crash leaves its input in artifacts/.
    if compgen -G "artifacts/$target/crash-*" >/dev/null || compgen -G "artifacts/$target/oom-*" >/dev/null; then
        log "$target found a crash: $(ls artifacts/$target)"
        exit 1
    fi
done
log "every target ran ${seconds}s without a crash"
