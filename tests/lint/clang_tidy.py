#!/usr/bin/env python3
"""clang-tidy (the checks of the repository's .clang-tidy) over every host source file of the
libraries and programs that BUILD_DIR's compile_commands.json compiles: common, codec, model,
optimizer, data, peer, engine, daemon, experiment, cli and the CPU kernels. Left out: the CUDA
sources (emulated or not; the sanitized emulation builds check them), generated protobuf code,
bench/ and tests/. Prints each finding; fails on any, or when clang-tidy is missing. First it
checks that clang's thread-safety analysis (turned on by .clang-tidy) finds the mistakes planted in
thread_safety_planted.cpp, so that a clean run cannot come from an analysis that is off.

A file found clean is remembered under ~/.cache/starling/clang-tidy by a hash of what decides its
findings: clang-tidy's version, .clang-tidy, the compile command, and the contents of the file and
of every header the build's dependency file names, paths taken relative to the source tree. An
unchanged file is not checked again, even in another clone, so a run after a small change takes
seconds instead of minutes.

usage: clang_tidy.py SOURCE_DIR BUILD_DIR
"""
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

FINDING = re.compile(r"(warning|error): .*\[[a-zA-Z.-]+(,[a-zA-Z.-]+)*\]$", re.MULTILINE)


def host_sources(source, entries):
    pattern = re.compile(re.escape(source) + r"/(common|codec|model|optimizer|data|peer|engine|"
                         r"daemon|experiment|cli|kernels(/cpu)?)/([^/]+/)*[^/]+\.cpp$")
    cuda = re.compile(re.escape(source) + "/kernels/cuda/")
    chosen = {}
    for e in entries:
        if pattern.match(e["file"]) and not cuda.match(e["file"]):
            chosen[e["file"]] = e
    return [chosen[f] for f in sorted(chosen)]


def dependencies(entry):
    """The files the build's dependency file says the object was compiled from, or None when the
    build left none (another generator, or not built yet)."""
    words = shlex.split(entry["command"])
    if "-o" not in words:
        return None
    depfile = Path(entry["directory"]) / (words[words.index("-o") + 1] + ".d")
    if not depfile.is_file():
        return None
    text = depfile.read_text().replace("\\\n", " ")
    if ":" not in text:
        return None
    return sorted({str(Path(entry["directory"]) / dep) for dep in text.split(":", 1)[1].split()})


def cache_key(entry, preamble, source):
    """Paths enter the key relative to the source tree, so that a fresh clone elsewhere (CI's)
    finds what a clone here found clean."""
    deps = dependencies(entry)
    if deps is None:
        return None
    digest = hashlib.sha256(preamble)
    digest.update(entry["command"].replace(source, "<source>").encode())
    for dep in [entry["file"]] + deps:
        try:
            digest.update(dep.replace(source, "<source>").encode() + b"\0" +
                          Path(dep).read_bytes())
        except OSError:
            return None
    return digest.hexdigest()


def tidy(build, entry):
    run = subprocess.run(["clang-tidy", "-p", build, "--quiet", entry["file"]],
                         capture_output=True, text=True)
    return run.returncode, run.stdout


def planted_mistakes_found(source):
    """Whether clang-tidy, with the repository's .clang-tidy, reports the lock mistakes planted in
    thread_safety_planted.cpp on exactly their lines: a clean run means nothing otherwise."""
    planted = Path(source) / "tests/lint/thread_safety_planted.cpp"
    expected = {i + 1 for i, line in enumerate(planted.read_text().splitlines())
                if "// PLANTED" in line}
    run = subprocess.run(["clang-tidy", "--quiet", str(planted), "--", "-std=c++20",
                          f"-I{source}"], capture_output=True, text=True)
    found = {int(m.group(1)) for m in
             re.finditer(re.escape(str(planted)) + r":(\d+):\d+: error: .*thread-safety",
                         run.stdout)}
    if found != expected:
        print(run.stdout)
        print(f"FAIL thread-safety analysis: planted mistakes on lines {sorted(expected)}, "
              f"found on {sorted(found)}")
        return False
    print(f"ok   thread-safety analysis finds the {len(expected)} planted mistakes")
    return True


def main():
    source, build = sys.argv[1], sys.argv[2]
    if shutil.which("clang-tidy") is None:
        print("FAIL clang-tidy is not installed (scripts/setup installs it)")
        return 1
    files = host_sources(source, json.load(open(Path(build) / "compile_commands.json")))
    if not files:
        print(f"FAIL no source files found in {build}/compile_commands.json")
        return 1
    if not planted_mistakes_found(source):
        return 1
    version = subprocess.run(["clang-tidy", "--version"], capture_output=True).stdout
    preamble = version + (Path(source) / ".clang-tidy").read_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "starling/clang-tidy"
    keys = {e["file"]: cache_key(e, preamble, source) for e in files}
    to_check = [e for e in files if keys[e["file"]] is None or
                not (cache / keys[e["file"]]).exists()]

    failed = []
    log = Path(build) / "clang-tidy.log"
    with open(log, "w") as out, concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        for entry, (status, text) in zip(to_check,
                                         pool.map(lambda e: tidy(build, e), to_check)):
            out.write(text)
            findings = len(FINDING.findall(text))
            if status != 0 or findings:
                failed.append((entry["file"], status, findings, text))
            elif keys[entry["file"]] is not None:
                cache.mkdir(parents=True, exist_ok=True)
                (cache / keys[entry["file"]]).touch()
    for file, status, findings, text in failed:
        print("\n".join(text.splitlines()[:60]))
        print(f"FAIL {file}: {findings} findings (clang-tidy exit {status})")
    if failed:
        print(f"FAIL clang-tidy: {len(failed)} of {len(files)} files (whole log: {log})")
        return 1
    print(f"ok   clang-tidy: {len(files)} files, no findings "
          f"({len(files) - len(to_check)} unchanged since a clean check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
