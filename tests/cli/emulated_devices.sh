#!/usr/bin/env bash
# `starling train` on emulated CUDA devices (builds with STARLING_CUDA_EMULATION): cuda:0 follows
# the CPU backend's losses, cuda:all over two devices trains with the host all-reduce, and a
# device that does not exist, or more devices than the batch splits into, is refused by name;
# "auto" trains on the CPU, and `starling check` says so, and why.
# usage: emulated_devices.sh STARLING_BINARY SOURCE_DIR
set -u
starling=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"

head -c 20000 /dev/urandom | base64 > "$work/text.txt"
"$starling" data prepare --input "$work/text.txt" --out "$work/data" > /dev/null 2>&1 ||
    { echo "FAIL prepare"; failures=$((failures + 1)); }
sed 's/^warmup_steps = .*/warmup_steps = 1/; s/^every = 100/every = 1/' \
    "$source_dir/configs/pico.toml" > "$work/pico.toml"
args=(train --config "$work/pico.toml" --data-dir "$work/data" --steps 4 --fresh --threads 1)

expect 0 "train on cuda:0" "emulated device 0" "done: 4 steps" -- "$starling" "${args[@]}" --device cuda:0 --run-dir "$work/gpu"
expect 0 "train on cpu" "done: 4 steps" -- "$starling" "${args[@]}" --device cpu --run-dir "$work/cpu"
# The fourth step's loss on the device against the CPU's: fp32 on both, within 1e-3.
loss_at_4() { grep -o "step      4/4 | loss [0-9.]*" "$1" | grep -o "[0-9.]*$"; }
"$starling" "${args[@]}" --device cuda:0 --run-dir "$work/gpu" > "$work/gpu.log" 2>&1
"$starling" "${args[@]}" --device cpu --run-dir "$work/cpu" > "$work/cpu.log" 2>&1
cases=$((cases + 1))
if awk -v a="$(loss_at_4 "$work/gpu.log")" -v b="$(loss_at_4 "$work/cpu.log")" \
    'BEGIN { d = a - b; if (a == "" || b == "" || d > 1e-3 || d < -1e-3) exit 1 }'; then
    echo "ok   cuda:0 loss at step 4 within 1e-3 of the CPU's"
else
    echo "FAIL cuda:0 loss at step 4: $(loss_at_4 "$work/gpu.log") against $(loss_at_4 "$work/cpu.log")"
    failures=$((failures + 1))
fi
expect 0 "train on cuda:all over two devices" "emulated device 1" "host all-reduce" "done: 4 steps" -- \
    env STARLING_EMULATED_DEVICES=2 "$starling" "${args[@]}" --device cuda:all --run-dir "$work/all"
expect 1 "a device that does not exist" "cuda:3" -- "$starling" "${args[@]}" --device cuda:3 --run-dir "$work/none"
expect 1 "a batch that does not split over three devices" "16" -- \
    env STARLING_EMULATED_DEVICES=3 "$starling" "${args[@]}" --device cuda:all --run-dir "$work/three"
# Device "auto" on emulated devices: `starling check` says what the trainer does and why.
expect 0 "train on auto takes the CPU, saying why" "no usable GPU: this build's CUDA devices are emulated" -- \
    "$starling" "${args[@]}" --device auto --run-dir "$work/auto"
expect 0 "check of auto says the same" "device: auto: trains on the CPU" \
    "no usable GPU: this build's CUDA devices are emulated" -- \
    env STARLING_PEER_SECRET=x STARLING_DATA_DIR="$work/data" STARLING_NODE_DATA_DIR="$work/node" \
    "$starling" check --config "$work/pico.toml" --listen 127.0.0.1:0 --control 127.0.0.1:0 --metrics 127.0.0.1:0
finish
