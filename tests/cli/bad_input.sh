#!/usr/bin/env bash
# Runs the real `starling` binary on bad input: each case must exit non-zero, print an error that
# names the file and the problem, and not crash (no signal, no core).
# usage: bad_input.sh STARLING_BINARY SOURCE_DIR
set -u
starling=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"

expect 1 "missing config" "error:" "$work/none.toml" -- \
    "$starling" train --config "$work/none.toml"

printf '[model]\nn_layers = 2\n' > "$work/typo.toml"
expect 1 "unknown config key" "typo.toml" "unknown key \[model\].n_layers" -- \
    "$starling" train --config "$work/typo.toml"

mkdir -p "$work/data"
expect 1 "no shards" "no train shards" "$work/data" -- \
    "$starling" train --config "$source_dir/configs/pico.toml" --data-dir "$work/data" --run-dir "$work/run"

printf 'hello' > "$work/data/train_000000.bin"
expect 1 "truncated shard" "train_000000.bin" "header" -- \
    "$starling" train --config "$source_dir/configs/pico.toml" --data-dir "$work/data" --run-dir "$work/run"

head -c 1024 /dev/zero > "$work/data/train_000000.bin"
expect 1 "wrong shard magic" "train_000000.bin" "magic" -- \
    "$starling" train --config "$source_dir/configs/pico.toml" --data-dir "$work/data" --run-dir "$work/run"

expect 1 "missing input text" "$work/none.txt" -- \
    "$starling" data prepare --input "$work/none.txt" --out "$work/prepared"

printf '{"model": {"type": "WordPiece"}}' > "$work/wordpiece.json"
expect 1 "a tokenizer that is not BPE" "wordpiece.json" "only BPE" -- \
    "$starling" data prepare --input "$work/wordpiece.json" --tokenizer "$work/wordpiece.json" --out "$work/prepared"
expect 1 "a vocabulary below the bytes" "257" -- \
    "$starling" data train-tokenizer --vocab-size 100 --out "$work/tokenizer.json"

# A real prepared dataset, then a corrupt checkpoint in the run directory.
head -c 20000 /dev/urandom | base64 > "$work/text.txt"
"$starling" data prepare --input "$work/text.txt" --out "$work/prepared" > /dev/null 2>&1 ||
    { echo "FAIL prepare"; failures=$((failures + 1)); }
mkdir -p "$work/run/step_00000010"
printf 'not a safetensors file' > "$work/run/step_00000010/model.safetensors"
cp "$source_dir/configs/pico.toml" "$work/pico.toml"
expect 1 "corrupt checkpoint" "step_00000010" -- \
    "$starling" train --config "$work/pico.toml" --data-dir "$work/prepared" --run-dir "$work/run"

expect 1 "export without a checkpoint" "no checkpoint under $work/empty-node/checkpoints" -- \
    "$starling" export --config "$work/pico.toml" --data-dir "$work/empty-node" --hf "$work/hf"
expect 1 "sample from a directory that holds no model" "$work/prepared/config.json" -- \
    "$starling" sample --model "$work/prepared" --prompt "In the"
"$starling" train --config "$work/pico.toml" --data-dir "$work/prepared" --run-dir "$work/good" --steps 60 \
    > /dev/null 2>&1 || { echo "FAIL train 60 steps"; failures=$((failures + 1)); }
expect 0 "sample from a training checkpoint" "^In the beginning" -- \
    "$starling" sample --model "$work/good/step_00000060" --prompt "In the beginning" --tokens 8 --temperature 0
expect 1 "sample with a negative temperature" "temperature" -- \
    "$starling" sample --model "$work/good/step_00000060" --prompt "In" --temperature -1

expect 1 "unknown experiment method" "method" "gossip" -- \
    env STARLING_EXPERIMENT_METHOD=gossip "$starling" experiment \
    --config "$source_dir/configs/experiments/swarm.toml" --data-dir "$work/prepared" --out-dir "$work/exp"

expect 1 "fused messages with a pull unlike the lr" "swarm.toml" "\[outer\].pull" -- \
    env STARLING_OUTER_PULL=0.2 "$starling" experiment \
    --config "$source_dir/configs/experiments/swarm.toml" --data-dir "$work/prepared" --out-dir "$work/exp"

expect 1 "experiment without data" "data-none" "does not exist" -- \
    "$starling" experiment --config "$source_dir/configs/experiments/swarm.toml" \
    --data-dir "$work/data-none" --out-dir "$work/exp"

finish
