// `starling completion bash|zsh`: a completion script generated from the command line's own
// definition (CLI11's tree of commands and options), so it can never fall behind the commands.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace starling::cli {

// A bash script that completes `program`'s commands, their options, and file names for an
// option's value or a positional argument. Options of a command's ancestors are offered too where
// CLI11 lets them follow the command (fallthrough), e.g. --control after `status`.
std::string bash_completion(const CLI::App& app, const std::string& program);

// The same for zsh, through zsh's bash-completion compatibility (bashcompinit).
std::string zsh_completion(const CLI::App& app, const std::string& program);

}  // namespace starling::cli
