#!/usr/bin/env bash
# `starling data prepare --config FILE`, as the systemd unit and the container's entry point run it
# before each start: it makes the shards the config reads with the config's tokenizer, does nothing
# when they are there already, and prepares again shards made with another tokenizer.
# usage: prepare_config.sh STARLING_BINARY
set -u
starling=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"

# A small text keeps each case well under a second; the tokenizer is learned from it.
for i in $(seq 1 200); do echo "In the beginning $i the earth was without form, and void."; done >"$work/text.txt"
"$starling" data train-tokenizer --input "$work/text.txt" --vocab-size 300 --out "$work/bpe.json" >/dev/null 2>&1 ||
    { echo "FAIL could not train the test tokenizer"; exit 1; }
printf '[model]\nvocab_size = 320\n[data]\ndir = "%s"\ntokenizer = "%s"\n' "$work/shards" "$work/bpe.json" >"$work/bpe.toml"
printf '[data]\ndir = "%s"\n' "$work/shards" >"$work/bytes.toml"

# holds NAME COMMAND...: a case that passes when COMMAND succeeds.
holds() {
    local name=$1
    shift
    cases=$((cases + 1))
    if "$@"; then echo "ok   $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
}
# The shards' tokenizer copy and the validation shard's inode: the same inode means not rewritten.
same_tokenizer() { cmp -s "$work/shards/tokenizer.json" "$work/bpe.json"; }
val_inode() { stat -c %i "$work/shards/val_000000.bin" 2>/dev/null; }

expect 0 "first start: prepares with the config's tokenizer" "preparing" "vocabulary 300" -- \
    "$starling" data prepare --config "$work/bpe.toml" --input "$work/text.txt"
holds "the shards carry the config's tokenizer" same_tokenizer
before=$(val_inode)

expect 0 "second start: nothing to do" "nothing to do" -- \
    "$starling" data prepare --config "$work/bpe.toml" --input "$work/text.txt"
holds "the second start left the shards as they were" test -n "$before" -a "$(val_inode)" = "$before"

expect 0 "a byte config over BPE shards prepares bytes" "preparing" "vocabulary 256" -- \
    "$starling" data prepare --config "$work/bytes.toml" --input "$work/text.txt"
holds "byte shards carry no tokenizer" test ! -e "$work/shards/tokenizer.json"

expect 0 "a BPE config over byte shards prepares BPE" "preparing" "vocabulary 300" -- \
    "$starling" data prepare --config "$work/bpe.toml" --input "$work/text.txt"
holds "the BPE shards carry the config's tokenizer" same_tokenizer

expect 0 "STARLING_DATA_DIR overrides the config's dir" "vocabulary 300" -- \
    env STARLING_DATA_DIR="$work/elsewhere" "$starling" data prepare --config "$work/bpe.toml" --input "$work/text.txt"
holds "the shards went to STARLING_DATA_DIR" test -e "$work/elsewhere/val_000000.bin"

expect 1 "a missing config is named" "$work/none.toml" -- \
    "$starling" data prepare --config "$work/none.toml"
expect 1 "--config with --out is refused" "excludes" -- \
    "$starling" data prepare --config "$work/bpe.toml" --out "$work/other"

finish
