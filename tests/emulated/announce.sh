# Sourced by the emulated host's scripts once brigd is up: tells the test outside how to reach
# it (the certificate pin and the access token, on the console), and defines `wait_label PHASE
# TICKS`, which returns once the test has created a sandbox labelled phase=PHASE (the test's
# way of saying "your turn"), or after TICKS fifths of a second.
pin=$(sed -n 's/.*"cert_sha256": *"\([0-9a-f]*\)".*/\1/p' /tmp/brig/endpoint.json)
echo "BRIG-L1-ENDPOINT pin=$pin token=$(cat /tmp/brig/access-token)"
wait_label() {
    n=0
    until /bin/brig ls --label "phase=$1" 2>/dev/null | grep -q sb- || [ $n -ge "$2" ]; do
        sleep 0.2; n=$((n + 1))
    done
}
