#!/usr/bin/env bash
# `starling completion bash|zsh`: the generated script, loaded into a real bash, must complete the
# commands, options and file names that `starling --help` and each command's --help list.
# usage: completion.sh STARLING_BINARY
set -u
starling=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=tests/cli/expect.sh
source "$(dirname "$0")/expect.sh"

script=$("$starling" completion bash) || { echo "FAIL: completion bash exited $?"; exit 1; }
eval "$script"

# complete WORD...: what bash offers for the last word, as the shell would call the function.
complete_line() {
    COMP_WORDS=("$@")
    COMP_CWORD=$(($# - 1))
    COMPREPLY=()
    _starling
    printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ' | sed 's/ $//'
}

# offers NAME EXPECTED WORD...: the completions must be exactly EXPECTED (sorted, space-separated).
offers() {
    local name=$1 expected=$2
    shift 2
    cases=$((cases + 1))
    local got
    got=$(complete_line "$@")
    if [ "$got" != "$expected" ]; then
        echo "FAIL $name: offered '$got', expected '$expected'"; failures=$((failures + 1)); return
    fi
    echo "ok   $name"
}

# Every command `starling --help` lists is offered on an empty word, and only those.
listed=$("$starling" --help | awk '/^Subcommands:/ {on = 1; next} on && NF {print $1}' | sort | tr '\n' ' ' |
         sed 's/ $//')
offers "every command from --help" "$listed" starling ""
offers "a command's prefix" "status" starling sta
offers "data's command by its prefix" "prepare" starling data pre
offers "watch's options, and --control falling through" "--control --count" starling watch --c
offers "a value-taking option before the command is passed over" "status" \
    starling --control 127.0.0.1:7701 sta
offers "sample's options after a quoted prompt" "--temperature" starling sample --prompt "In the" --te
offers "check's short option" "-c" starling check -c
offers "an unknown command offers nothing of its own" "" starling nosuchcommand --x

mkdir -p "$work/runs/one" && touch "$work/runs/pico.toml"
cd "$work/runs" || exit 1
offers "an option's value is a file name" "pico.toml" starling train --config pi
offers "a directory for export --hf" "one" starling export --hf o
offers "a value that looks like a command is still a value" "--fresh" starling train --run-dir status --fr

# Each option a command's --help lists is offered for it (checked for every command).
cases=$((cases + 1))
missing=0
checked=0
for command in $(complete_line starling ""); do
    for option in $("$starling" "$command" --help | grep -oE '^ +(-[a-z],)?--[a-z-]+' | grep -oE -- '--[a-z-]+'); do
        checked=$((checked + 1))
        if [[ " $(complete_line starling "$command" --) " != *" $option "* ]]; then
            echo "FAIL $command: --help lists $option, completion does not offer it"; missing=$((missing + 1))
        fi
    done
done
if [ "$missing" -eq 0 ] && [ "$checked" -gt 40 ]; then
    echo "ok   all $checked options the commands' --help list are offered"
else
    echo "FAIL $missing of $checked options not offered"; failures=$((failures + 1))
fi

zsh_script=$("$starling" completion zsh)
cases=$((cases + 1))
if grep -q "bashcompinit" <<<"$zsh_script" && grep -qF "$script" <<<"$zsh_script"; then
    echo "ok   zsh: the bash script through bashcompinit"
else
    echo "FAIL zsh: the script does not load bashcompinit and the bash completion"; failures=$((failures + 1))
fi

expect 1 "an unknown shell" "fish" -- "$starling" completion fish
finish
