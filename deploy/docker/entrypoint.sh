#!/bin/sh
# Container entry point: prepares the KJV token shards on first start (a few seconds), then
# replaces itself with starlingd, so that the daemon is PID 1 and gets SIGTERM directly (drain).
# Arguments are passed on to starlingd, e.g. --seed node1:7700 or --log-level debug.
set -eu

state=/var/lib/starling
export STARLING_DATA_DIR="${STARLING_DATA_DIR:-$state/kjv}"

# Shards are written train first, then val, each file atomically: val_000000.bin means done.
if [ ! -e "$STARLING_DATA_DIR/val_000000.bin" ]; then
    starling data prepare --out "$STARLING_DATA_DIR"
fi

exec starlingd --config "${STARLING_CONFIG:-/etc/starling/pico.toml}" --data-dir "$state" "$@"
