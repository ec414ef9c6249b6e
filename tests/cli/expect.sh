# Sourced by the CLI test scripts: runs one case of a real binary and checks how it ended.
# expect STATUS NAME PATTERN... -- COMMAND...: the command must exit with STATUS (within 60 s,
# so a hang fails too) and print every PATTERN (grep); prints "ok" or "FAIL" with the output.
failures=0
cases=0

expect() {
    local status=$1 name=$2
    shift 2
    local patterns=()
    while [ "$1" != "--" ]; do patterns+=("$1"); shift; done
    shift
    cases=$((cases + 1))
    local out rc
    out=$(timeout 60 "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$status" ]; then
        echo "FAIL $name: exit status $rc, expected $status"; echo "$out"; failures=$((failures + 1)); return
    fi
    for p in "${patterns[@]}"; do
        if ! grep -q -- "$p" <<<"$out"; then
            echo "FAIL $name: output lacks '$p'"; echo "$out"; failures=$((failures + 1)); return
        fi
    done
    echo "ok   $name"
}

# The summary line and the script's exit status.
finish() {
    echo "$((cases - failures)) passed, $failures failed"
    [ "$failures" -eq 0 ]
}
