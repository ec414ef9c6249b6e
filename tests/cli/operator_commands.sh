#!/usr/bin/env bash
# Runs the real `starling` binary's operator commands without a daemon: each case must exit with
# the documented status (0 done, 1 bad input or a failed check, 2 no node at the address), print
# what names the problem, and not crash or hang.
# usage: operator_commands.sh STARLING_BINARY SOURCE_DIR
set -u
starling=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"

# A port of 127.0.0.1 that refuses connections: nothing listens there.
closed_port() {
    local port
    for _ in $(seq 100); do
        port=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
    done
    echo "no closed port found" >&2; exit 1
}
nowhere="127.0.0.1:$(closed_port)"

expect 2 "status with no node" "cannot reach starlingd at $nowhere" "STARLING_CONTROL" -- \
    "$starling" status --control "$nowhere"
expect 2 "peers --json with no node (address from STARLING_CONTROL)" "cannot reach starlingd at $nowhere" -- \
    env STARLING_CONTROL="$nowhere" "$starling" peers --json
expect 2 "watch with no node" "cannot reach starlingd at $nowhere" -- \
    "$starling" --control "$nowhere" watch --count 1
expect 2 "leave with no node on a unix socket" "cannot reach starlingd at unix:$work/none.sock" -- \
    "$starling" leave --control "unix:$work/none.sock"
expect 2 "export from no node (no config given)" "cannot reach starlingd at $nowhere" -- \
    "$starling" export --control "$nowhere" --hf "$work/hf"
expect 2 "sample from no node" "cannot reach starlingd at $nowhere" -- \
    "$starling" sample --prompt "In the" --control "$nowhere"
expect 1 "join with a seed that is not host:port" "notaport" "host:port" -- \
    "$starling" join --control "$nowhere" 10.0.0.2:7700 notaport
expect 1 "join with port 0" "10.0.0.2:0" -- \
    "$starling" join --control "$nowhere" 10.0.0.2:0
expect 1 "join with no seed" "seeds" -- \
    "$starling" join --control "$nowhere"
expect 1 "watch with a negative count" "count" -- \
    "$starling" watch --control "$nowhere" --count -1
expect 1 "status with a control address that is not one" "garbage" "unix:/path" -- \
    "$starling" status --control garbage
expect 1 "peers with an empty control address" "control address ''" -- \
    "$starling" peers --control ""
expect 0 "status --help" "--json" "STARLING_CONTROL" -- \
    "$starling" status --help

printf '[model]\nn_layers = 2\n' > "$work/typo.toml"
expect 1 "check with a config key typo" "FAIL  config" "unknown key \[model\].n_layers" -- \
    "$starling" check --config "$work/typo.toml"

# A node that is ready to start: shards prepared, its own directory, free ports.
head -c 20000 /dev/urandom | base64 > "$work/text.txt"
"$starling" data prepare --input "$work/text.txt" --out "$work/shards" > /dev/null 2>&1 ||
    { echo "FAIL prepare"; failures=$((failures + 1)); }
ready=(env STARLING_PEER_SECRET=x STARLING_DATA_DIR="$work/shards" STARLING_NODE_DATA_DIR="$work/node")
free_ports=(--listen 127.0.0.1:0 --control 127.0.0.1:0 --metrics 127.0.0.1:0)
expect 0 "check of a node that can start" "ok    data:" "ok    announce:" "ready to start starlingd" -- \
    "${ready[@]}" "$starling" check --config "$source_dir/configs/pico.toml" "${free_ports[@]}"

mkdir -p "$work/empty"
expect 1 "check without data" "FAIL  data:" "fix: starling data prepare --out $work/empty" -- \
    "${ready[@]}" STARLING_DATA_DIR="$work/empty" "$starling" check --config "$source_dir/configs/pico.toml" \
    "${free_ports[@]}"
expect 1 "check listening on every interface with no announce" "FAIL  announce:" "\[peer\].announce" -- \
    "${ready[@]}" "$starling" check --config "$source_dir/configs/pico.toml" --listen 0.0.0.0:0 \
    --control 127.0.0.1:0 --metrics "" --seed 10.0.0.2:7700
expect 1 "check without a secret" "FAIL  config" "\[peer\].secret" -- \
    env -u STARLING_PEER_SECRET "$starling" check --config "$source_dir/configs/pico.toml"
cases=$((cases + 1))
out=$("${ready[@]}" STARLING_PEER_SECRET=s3cr3t-never-shown-0123456789 "$starling" check \
    --config "$source_dir/configs/pico.toml" "${free_ports[@]}" 2>&1)
if grep -q s3cr3t <<<"$out" || ! grep -q "secret (not shown)" <<<"$out"; then
    echo "FAIL check prints the secret, or not that one is set"; echo "$out"; failures=$((failures + 1))
else
    echo "ok   check never prints the secret"
fi

finish
