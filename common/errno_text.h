// errno's text for error messages.
#pragma once

#include <string>
#include <system_error>

namespace starling {

// Safe in any thread, unlike std::strerror, which may share one buffer between threads.
inline std::string errno_text(int err) { return std::generic_category().message(err); }

}  // namespace starling
