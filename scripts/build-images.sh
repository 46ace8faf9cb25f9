#!/usr/bin/env bash
# Builds the container layer images the demo and tests use into artifacts/images/:
# busybox.erofs (tiny base) and debian-12.erofs (debootstrap minbase + what E2B's base template
# has: bash, python3 and pip, git, curl, wget, sudo, ca-certificates, build-essential; and E2B's
# default user `user`, with sudo, so the E2B API need not add it to each sandbox).
# Idempotent: an image is rebuilt only when missing or when its recipe (this script) changed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BRIG_ARTIFACTS:-$root/artifacts}/images"
mkdir -p "$out"
target="${CARGO_TARGET_DIR:-$root/target}"
(cd "$root" && cargo build --quiet -p brig-images --bin brig-mkimage)
mkimage="$target/debug/brig-mkimage"
recipe=$(sha256sum "$0" | cut -c1-16)

build() { # name, then brig-mkimage arguments
    local name=$1; shift
    local image="$out/$name.erofs" stamp="$out/$name.recipe"
    if [[ -f "$image" && "$(cat "$stamp" 2>/dev/null)" == "$recipe" ]]; then
        return
    fi
    echo "[images] building $name"
    "$mkimage" "$@" "$image"
    echo "$recipe" > "$stamp"
}

build busybox busybox
build debian-12 debian --suite bookworm \
    --include bash,coreutils,python3,python3-pip,git,ca-certificates,procps,curl,wget,sudo,build-essential \
    --user user
echo "images in $out"
