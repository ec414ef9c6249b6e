#!/usr/bin/env bash
# clang-tidy (the checks of the repository's .clang-tidy) over every host source file of the
# libraries and programs that BUILD_DIR's compile_commands.json compiles: common, codec, model,
# optimizer, data, peer, engine, daemon, experiment, cli and the CPU kernels. Left out: the CUDA
# sources (emulated or not; the sanitized emulation builds check them), generated protobuf code,
# bench/ and tests/. Prints each finding; fails on any, or when clang-tidy is missing.
# usage: clang_tidy.sh SOURCE_DIR BUILD_DIR
set -u
source_dir="$1"
build_dir="$2"
if ! command -v clang-tidy >/dev/null; then
    echo "FAIL clang-tidy is not installed (scripts/setup installs it)"; exit 1
fi
mapfile -t files < <(python3 - "$source_dir" "$build_dir/compile_commands.json" <<'PY'
import json, re, sys
source, database = sys.argv[1], sys.argv[2]
pattern = re.compile(re.escape(source) +
    r"/(common|codec|model|optimizer|data|peer|engine|daemon|experiment|cli|kernels(/cpu)?)/([^/]+/)*[^/]+\.cpp$")
cuda = re.escape(source) + "/kernels/cuda/"
print("\n".join(sorted({e["file"] for e in json.load(open(database))
                        if pattern.match(e["file"]) and not re.match(cuda, e["file"])})))
PY
)
if [ ${#files[@]} -eq 0 ]; then
    echo "FAIL no source files found in $build_dir/compile_commands.json"; exit 1
fi
log="$build_dir/clang-tidy.log"
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$build_dir" --quiet >"$log" 2>/dev/null
status=$?
findings=$(grep -cE "(warning|error): .*\[[a-zA-Z.-]+(,[a-zA-Z.-]+)*\]$" "$log")
if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
    grep -E -A3 "(warning|error): " "$log" | head -200
    echo "FAIL clang-tidy: $findings findings in ${#files[@]} files (exit $status; whole log: $log)"
    exit 1
fi
echo "ok   clang-tidy: ${#files[@]} files, no findings"
