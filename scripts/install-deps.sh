#!/usr/bin/env bash
# Installs what Brig needs and is missing: Rust targets, Debian packages, kernel settings.
# Idempotent: a second run changes nothing. Needs root for packages and sysctls (skipped, with a
# warning, when not root).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

log() { printf '\033[1m[install]\033[0m %s\n' "$*"; }

# Rust targets: wasm32-wasip2 for tool components, musl for the static in-guest agent.
installed=$(rustup target list --installed)
for target in wasm32-wasip2 x86_64-unknown-linux-musl; do
    if ! grep -qx "$target" <<<"$installed"; then
        log "rustup target add $target"
        rustup target add "$target"
    fi
done

# Debian packages: erofs-utils (read-only layers), busybox-static (tiny base image),
# debootstrap (Debian base image), e2fsprogs (writable-layer disks), iproute2 + nftables (sandbox
# networks and egress rules), fuse3 (on-demand layer data), etcd-server (durable cluster state
# for the control-plane replicas), protobuf-compiler (the etcd client's gRPC code is generated at
# build time), qemu-system-x86 + cpio + kmod (the emulated host that runs Linux guests on
# brig-vmm in the tests, docs/GUEST.md section 2; kmod's depmod indexes its kernel modules), util-linux
# (nsenter), xfsprogs (mkfs.xfs: the node's store of containers' writable layers, with project
# quotas; e2fsprogs' mkfs.ext4 makes a per-container image where the kernel has no XFS quotas),
# docker-registry + skopeo (the OCI registry the pull tests run on loopback, and what pushes
# their images to it), openssl (the CA and certificate of the TLS registry test) and umoci (the
# eager unpack `brig-bench pull` compares against).
packages=(erofs-utils busybox-static debootstrap e2fsprogs iproute2 nftables fuse3 procps psmisc curl
    etcd-server protobuf-compiler qemu-system-x86 cpio kmod util-linux xfsprogs docker-registry skopeo
    openssl umoci)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "WARNING: not root; cannot install ${missing[*]}"
    else
        log "apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

# moto's S3 server, which the layer-store tests run on loopback as an S3-compatible backend.
if ! command -v moto_server >/dev/null 2>&1; then
    log "pip install moto[server]"
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]'
fi

# E2B's SDKs, the clients our E2B-compatible API is tested with: the pinned Python SDK and
# pytest in a venv (artifacts/venv) with E2B's SDK and what builds and checks ours (maturin,
# mypy); the pinned JS SDK (artifacts/node, from its lock file).
venv="$root/artifacts/venv"
mkdir -p "$root/artifacts"
requirements="$root/artifacts/requirements.txt"
cat "$root/tests/e2b/requirements.txt" "$root/sdk/python/requirements-dev.txt" > "$requirements"
if [[ ! -x $venv/bin/python ]]; then
    log "python3 -m venv $venv"
    python3 -m venv "$venv"
fi
if ! cmp -s "$requirements" "$venv/.requirements"; then
    log "pip install -r tests/e2b/requirements.txt -r sdk/python/requirements-dev.txt"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$venv/.requirements"
fi
# The oldest supported release of E2B's Python SDK, beside the newest (tests/tests/e2b.rs says
# which cases run with it).
oldest="$root/artifacts/venv-e2b-oldest"
if [[ ! -x $oldest/bin/python ]]; then
    log "python3 -m venv $oldest"
    python3 -m venv "$oldest"
fi
if ! cmp -s "$root/tests/e2b/requirements-oldest.txt" "$oldest/.requirements"; then
    log "pip install -r tests/e2b/requirements-oldest.txt (into $oldest)"
    "$oldest/bin/pip" install --quiet --disable-pip-version-check \
        -r "$root/tests/e2b/requirements-oldest.txt"
    cp "$root/tests/e2b/requirements-oldest.txt" "$oldest/.requirements"
fi
node_dir="$root/artifacts/node"
if ! cmp -s "$root/tests/e2b-js/package-lock.json" "$node_dir/package-lock.json" \
    || [[ ! -d $node_dir/node_modules/e2b ]]; then
    log "npm ci (tests/e2b-js)"
    mkdir -p "$node_dir"
    cp "$root/tests/e2b-js/package.json" "$root/tests/e2b-js/package-lock.json" "$node_dir/"
    (cd "$node_dir" && npm ci --no-audit --no-fund --silent)
fi

# Kernel settings: larger UDP buffers for QUIC bursts (docs/GUEST.md §6), and enough memory mappings
# for 100k+ live Wasm instances (each uses ~4; the default 65530 caps near 16k).
want_sysctl() {
    local key=$1 want=$2 have
    have=$(sysctl -n "$key" 2>/dev/null || echo 0)
    if ((have < want)); then
        if [[ $(id -u) -eq 0 ]] && sysctl -qw "$key=$want" 2>/dev/null; then
            log "sysctl $key=$want (was $have)"
        else
            log "WARNING: cannot raise $key to $want (is $have)"
        fi
    fi
}
want_sysctl net.core.rmem_max 8388608
want_sysctl net.core.wmem_max 8388608
want_sysctl vm.max_map_count 1048576
log "dependencies ready"
