#!/usr/bin/env bash
# The main job: install what is missing, build, start the all-in-one brigd, and run a short demo
# rollout through the SDK. With --serve, brigd keeps running in the foreground afterwards.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
serve=0
[[ "${1:-}" == "--serve" ]] && serve=1

"$root/scripts/install-deps.sh"
"$root/scripts/build-guests.sh"
"$root/scripts/build-images.sh"
echo "[demo] building release binaries"
# brig-shim (brig-container) runs every container, brig-lazyfs (brig-images) serves store layers;
# brig-vmm and brig-agent serve the VM tiers.
cargo build --release --quiet -p brigd -p brig-cli -p brig-container -p brig-images --bins
cargo build --release --quiet -p brig-sdk --example rollout
target="${CARGO_TARGET_DIR:-$root/target}/release"

export BRIG_STATE_DIR="${BRIG_STATE_DIR:-$root/artifacts/demo-state}"
mkdir -p "$BRIG_STATE_DIR"
rm -f "$BRIG_STATE_DIR/endpoint.json"
"$target/brigd" --state-dir "$BRIG_STATE_DIR" --listen 127.0.0.1:0 --e2b-listen 127.0.0.1:0 \
    --tools-dir "$root/artifacts/guests/tools" --images-dir "$root/artifacts/images" \
    2>"$BRIG_STATE_DIR/brigd.log" &
brigd_pid=$!
trap 'kill $brigd_pid 2>/dev/null || true; wait $brigd_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    [[ -f "$BRIG_STATE_DIR/endpoint.json" ]] && break
    kill -0 $brigd_pid 2>/dev/null || { cat "$BRIG_STATE_DIR/brigd.log"; exit 1; }
    sleep 0.1
done
echo "[demo] brigd running (pid $brigd_pid, state $BRIG_STATE_DIR)"
"$target/examples/rollout"
echo "[demo] the CLI works too:"
"$target/brig" tool ls
e2b_addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["e2b"] or "")' "$BRIG_STATE_DIR/endpoint.json")
if [[ -n $e2b_addr && -f $root/artifacts/images/debian-12.erofs ]]; then
    E2B_API_URL="http://$e2b_addr" E2B_SANDBOX_URL="http://$e2b_addr" \
        E2B_API_KEY="$(head -1 "$BRIG_STATE_DIR/access-token")" \
        "$root/artifacts/venv/bin/python" "$root/scripts/demo_e2b.py"
else
    echo "[demo] e2b SDK: skipped (no E2B API address or no debian-12 image)"
fi
echo "[demo] Python SDK: pip install ./sdk/python (builds the wheel), then 16 rollouts"
"$root/artifacts/venv/bin/pip" install --quiet --disable-pip-version-check "$root/sdk/python"
"$root/artifacts/venv/bin/python" "$root/sdk/python/examples/slime_rollouts.py" 16
if ((serve)); then
    echo "[demo] brigd keeps serving; try: BRIG_STATE_DIR=$BRIG_STATE_DIR $target/brig call jq '{\"query\":\"\$\",\"json\":1}'"
    wait $brigd_pid
fi
