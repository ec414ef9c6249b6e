#!/usr/bin/env bash
# Runs each planted bug of emulation_faults under the build's sanitizer and checks that the report
# names the bug and the kernel, and that the clean kernels run without one.
# usage: sanitized_faults.sh EMULATION_FAULTS thread|address
set -uo pipefail
program=$1 sanitizer=$2
export OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66" ASAN_OPTIONS="exitcode=66"
failures=0

expect() {  # fault, then the strings its report must contain
    local fault=$1; shift
    local output status
    output=$("$program" "$fault" 2>&1); status=$?
    if [ "$status" -ne 66 ]; then
        echo "FAIL $fault: exit $status, expected the sanitizer's 66"; echo "$output" | tail -20
        failures=$((failures + 1)); return
    fi
    for want in "$@"; do
        if ! grep -qF -- "$want" <<<"$output"; then
            echo "FAIL $fault: report lacks \"$want\""; echo "$output" | head -40
            failures=$((failures + 1)); return
        fi
    done
    echo "ok   $fault: reported"
}

output=$("$program" clean 2>&1); status=$?
if [ "$status" -ne 0 ]; then
    echo "FAIL clean: exit $status"; echo "$output" | tail -20; failures=$((failures + 1))
else
    echo "ok   clean: no report"
fi

if [ "$sanitizer" = thread ]; then
    expect missing-barrier "ThreadSanitizer: data race" "rotate_kernel<false>" "racy_kernels.h:1"
    expect two-blocks-one-slot "ThreadSanitizer: data race" "same_slot_kernel block (" "racy_kernels.h:23"
else
    expect global-out-of-bounds "AddressSanitizer: heap-buffer-overflow" "unguarded_copy_kernel" "emulation_faults.cpp:26"
    expect shared-out-of-bounds "AddressSanitizer: heap-buffer-overflow" "shared_overrun_kernel" "emulation_faults.cpp:31"
fi
[ "$failures" -eq 0 ] && echo "every planted bug was reported"
exit $((failures > 0))
