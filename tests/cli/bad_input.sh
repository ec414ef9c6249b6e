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

expect 1 "missing config" "error: config file '$work/none.toml' does not exist" -- \
    "$starling" train --config "$work/none.toml"
expect 1 "a misspelt command" "unknown command 'stauts'" "did you mean 'status'" -- \
    "$starling" stauts
expect 1 "a word that is no command" "unknown command 'frobnicate'" "starling --help" -- \
    "$starling" --control 127.0.0.1:1 frobnicate

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

expect 1 "export without a checkpoint" "no checkpoint under $work/empty-node/checkpoints or $work/no-runs" \
    "\[swarm\].checkpoint_every" "\[checkpoint\].every" -- \
    env STARLING_CHECKPOINT_DIR="$work/no-runs" \
    "$starling" export --config "$work/pico.toml" --data-dir "$work/empty-node" --hf "$work/hf"
expect 1 "sample from a directory that holds no model" "$work/prepared/config.json" -- \
    "$starling" sample --model "$work/prepared" --prompt "In the"
"$starling" train --config "$work/pico.toml" --data-dir "$work/prepared" --run-dir "$work/good" --steps 60 \
    > /dev/null 2>&1 || { echo "FAIL train 60 steps"; failures=$((failures + 1)); }
expect 0 "sample from a training checkpoint" "^In the beginning" -- \
    "$starling" sample --model "$work/good/step_00000060" --prompt "In the beginning" --tokens 8 --temperature 0
# `starling train`'s checkpoints through the config, as the single-node flow exports them: one
# named, or the newest of [checkpoint].dir when the node has none.
expect 0 "export a training checkpoint named" "exported step 60 of $work/good/step_00000060" -- \
    "$starling" export --config "$work/pico.toml" --checkpoint "$work/good/step_00000060" --hf "$work/hf-60"
expect 0 "export the newest training checkpoint" "exported step 60 of $work/good/step_00000060" -- \
    env STARLING_CHECKPOINT_DIR="$work/good" \
    "$starling" export --config "$work/pico.toml" --data-dir "$work/empty-node" --hf "$work/hf-newest"
expect 0 "sample from a training checkpoint through its config" "^In the" -- \
    "$starling" sample --config "$work/pico.toml" --checkpoint "$work/good/step_00000060" --prompt "In the" --tokens 4

# A misspelt setting is named; the variables of starlingd's settings, which the shell may hold for
# it, are not.
cases=$((cases + 1))
out=$(env STARLING_TRAIN_STPES=5 STARLING_PEER_SECRET=x "$starling" train --config "$work/pico.toml" \
    --data-dir "$work/prepared" --run-dir "$work/warned" --steps 1 2>&1)
if ! grep -q "environment variable STARLING_TRAIN_STPES is not a Starling setting" <<<"$out" ||
    grep -q "STARLING_PEER_SECRET is not" <<<"$out"; then
    echo "FAIL train names a misspelt variable, and only that"; echo "$out"; failures=$((failures + 1))
else
    echo "ok   train names a misspelt variable, and only that"
fi

# A 320-token model (a BPE vocabulary of 300 padded) refuses a 256-token tokenizer.json, naming both.
"$starling" data train-tokenizer --input "$work/text.txt" --vocab-size 300 --out "$work/bpe.json" > /dev/null 2>&1 &&
    "$starling" data prepare --input "$work/text.txt" --tokenizer "$work/bpe.json" --out "$work/prepared-bpe" \
        > /dev/null 2>&1 || { echo "FAIL prepare BPE shards"; failures=$((failures + 1)); }
sed "s/^vocab_size = 256/vocab_size = 320/; s|^\[data\]|[data]\ntokenizer = \"$work/bpe.json\"|" \
    "$work/pico.toml" > "$work/pico-bpe.toml"
STARLING_OPTIMIZER_WARMUP_STEPS=1 "$starling" train --config "$work/pico-bpe.toml" --data-dir "$work/prepared-bpe" \
    --run-dir "$work/bpe-run" --steps 2 > /dev/null 2>&1 || { echo "FAIL train the BPE model"; failures=$((failures + 1)); }
expect 1 "sample with a tokenizer of another vocabulary" "(256 tokens" "320 tokens" -- \
    "$starling" sample --model "$work/bpe-run/step_00000002" --tokenizer "$work/good/step_00000060/tokenizer.json" \
    --prompt "In the"
expect 1 "export with a tokenizer of another vocabulary" "(256 tokens" "320 tokens" -- \
    "$starling" export --config "$work/pico-bpe.toml" --checkpoint "$work/bpe-run/step_00000002" \
    --tokenizer "$work/good/step_00000060/tokenizer.json" --hf "$work/hf-wrong"
expect 0 "sample with the model's own tokenizer" "^In the" -- \
    "$starling" sample --model "$work/bpe-run/step_00000002" --prompt "In the" --tokens 4
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
