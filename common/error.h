// The one exception type: its message names the thing at fault (a file, a tensor, a config key)
// and the problem, so the CLI can print it and exit non-zero.
#pragma once

#include <stdexcept>

namespace starling {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace starling
