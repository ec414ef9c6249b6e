#!/bin/sh
# Container entry point: prepares the token shards its config reads on first start (the KJV, with
# the config's [data].tokenizer; a few seconds), then
# replaces itself with starlingd, so that the daemon is PID 1 and gets SIGTERM directly (drain).
# Arguments are passed on to starlingd, e.g. --seed node1:7700 or --log-level debug.
set -eu

state=/var/lib/starling
export STARLING_DATA_DIR="${STARLING_DATA_DIR:-$state/kjv}"

config="${STARLING_CONFIG:-/etc/starling/pico.toml}"

# Does nothing when the shards are there already, made with that tokenizer.
starling data prepare --config "$config"

exec starlingd --config "$config" --data-dir "$state" "$@"
