#!/usr/bin/python3
"""Checks that scripts/build-packages, the package list scripts/setup and both Docker builders
install from, covers every dependency the CMake files look for: each find_package and
pkg_check_modules is resolved to the file that satisfies it on this machine (a CMake package
config, a .pc file, or for CMake's own Find modules the packages named below), dpkg names the
package that owns that file, and that package must be in the list or be installed by it (a
dependency, as apt-get installs them). Also checks that each Dockerfile's builder installs from the
list rather than a list of its own.

usage: check_build_packages.py SOURCE_DIR   (exits 1 naming every problem found)
"""
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

# CMake's own Find modules name no file of the package: what each needs, by hand.
FIND_MODULES = {
    "Protobuf": ["libprotobuf-dev", "protobuf-compiler"],
    "OpenSSL": ["libssl-dev"],
    "PkgConfig": ["pkg-config"],
}
# Found elsewhere than in the list, with why.
NOT_LISTED = {
    "OpenMP": "the compiler's own runtime (build-essential's g++)",
    "CUDAToolkit": "the CUDA toolkit: the GPU image's nvidia/cuda base, nvcc elsewhere",
    "Catch2": "tests only: the images build with BUILD_TESTING=OFF",
    "Boost": "the CUDA emulator only (STARLING_CUDA_EMULATION=ON), which the images do not build",
}
# Programs the build runs that come with no find_package of their own: gRPC's config imports the
# code generator as a target (gRPC::grpc_cpp_plugin) from another package than its headers.
PROGRAMS = ["/usr/bin/grpc_cpp_plugin"]

FIND_PACKAGE = re.compile(r"^\s*find_package\(\s*([A-Za-z0-9_+-]+)", re.MULTILINE)
PKG_CHECK = re.compile(r"^\s*pkg_check_modules\(\s*\w+((?:\s+[^)\s]+)+)\s*\)", re.MULTILINE)
PKG_OPTIONS = {"REQUIRED", "QUIET", "IMPORTED_TARGET", "GLOBAL", "NO_CMAKE_PATH", "NO_CMAKE_ENVIRONMENT_PATH"}


def listed_packages(source):
    text = (source / "scripts" / "build-packages").read_text()
    return {p for line in text.splitlines() for p in line.split("#", 1)[0].split()}


def cmake_dependencies(source):
    """(kind, name) for each find_package and pkg_check_modules module outside build trees."""
    found = set()
    for path in source.rglob("CMakeLists.txt"):
        if any(part.startswith("build") for part in path.relative_to(source).parts[:-1]):
            continue
        text = path.read_text()
        found |= {("package", name) for name in FIND_PACKAGE.findall(text)}
        for modules in PKG_CHECK.findall(text):
            found |= {("pkg-config", m) for m in modules.split() if m not in PKG_OPTIONS}
    return found


def owners(patterns):
    """For each dpkg-query -S pattern, the one package owning the installed files it matches, or
    None (one dpkg-query for all: each call reads dpkg's whole file database)."""
    result = subprocess.run(["dpkg-query", "-S", *patterns], capture_output=True, text=True)
    found = {pattern: set() for pattern in patterns}
    for line in result.stdout.splitlines():
        package, path = line.split(": ", 1)
        for pattern in patterns:
            if fnmatch.fnmatch(path, pattern):
                found[pattern].add(package.split(":")[0])
    return {pattern: packages.pop() if len(packages) == 1 else None for pattern, packages in found.items()}


def depends_closure(packages):
    """The packages and all they depend on (Depends, Pre-Depends), as installed here."""
    fields = "${Package}\t${Provides}\t${Depends}, ${Pre-Depends}\n"
    result = subprocess.run(["dpkg-query", "-W", "-f", fields], capture_output=True, text=True, check=True)
    provided_by, depends = {}, {}
    for line in result.stdout.splitlines():
        name, provides, deps = line.split("\t")
        # Each alternative group "a | b (>= 1)": any of them may be what apt installed.
        depends[name] = [re.sub(r"[ (:].*", "", alt.strip()) for group in deps.split(",")
                         for alt in group.split("|") if alt.strip()]
        for virtual in provides.split(","):
            if virtual.strip():
                provided_by.setdefault(re.sub(r"[ (].*", "", virtual.strip()), []).append(name)
    seen, todo = set(), list(packages)
    while todo:
        name = todo.pop()
        for real in [name] + provided_by.get(name, []):
            if real not in seen:
                seen.add(real)
                todo.extend(depends.get(real, []))
    return seen


def main(source_dir):
    source = Path(source_dir)
    listed = listed_packages(source)
    installed = depends_closure(listed)
    dependencies = sorted(d for d in cmake_dependencies(source) if d[1] not in NOT_LISTED)
    candidates = {d: [f"*/pkgconfig/{d[1]}.pc"] if d[0] == "pkg-config"
                  else [f"*/{d[1]}Config.cmake", f"*/{d[1].lower()}-config.cmake"]
                  for d in dependencies if d[1] not in FIND_MODULES}
    owner = owners([p for patterns in candidates.values() for p in patterns] + PROGRAMS)
    problems = []
    for kind, name in dependencies:
        if name in FIND_MODULES:
            needs = FIND_MODULES[name]
        else:
            needs = [next((owner[p] for p in candidates[(kind, name)] if owner[p]), None)]
        if None in needs:
            problems.append(f"{kind} {name}: no installed package provides it here; add its package to "
                            "scripts/build-packages (or, if the images need it from elsewhere, to NOT_LISTED "
                            "here with why)")
            continue
        missing = [p for p in needs if p not in installed]
        if missing:
            problems.append(f"{kind} {name} needs {', '.join(missing)}, which scripts/build-packages does not install")
    for program in PROGRAMS:
        if owner[program] not in installed:
            problems.append(f"{program} ({owner[program]}) is run by the build but scripts/build-packages does not "
                            "install it")
    for name in ("Dockerfile", "Dockerfile.cpu"):
        text = (source / "deploy" / "docker" / name).read_text()
        builder = re.split(r"^FROM ", text, flags=re.MULTILINE)[1]
        if "COPY scripts/build-packages" not in builder or re.search(r"[a-z0-9]-dev\b", builder):
            problems.append(f"deploy/docker/{name}: the builder does not install scripts/build-packages alone")
    for problem in problems:
        print(problem)
    print(f"build packages: {len(listed)} listed, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
