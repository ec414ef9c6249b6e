#!/usr/bin/env bash
# Every C++ and CUDA file git tracks is as clang-format leaves it (the repository's .clang-format).
# Prints the files that are not and how to fix them; fails when clang-format is missing.
# usage: check_format.sh SOURCE_DIR
set -u
cd "$1" || exit 1
if ! command -v clang-format >/dev/null; then
    echo "FAIL clang-format is not installed (scripts/setup installs it)"; exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
unformatted=()
for f in "${files[@]}"; do
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
    printf 'FAIL not formatted: %s\n' "${unformatted[@]}"
    echo "fix: clang-format -i ${unformatted[*]}"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "ok   ${#files[@]} files formatted"
