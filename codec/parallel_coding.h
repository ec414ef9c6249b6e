// When the codecs share a range out to OpenMP's team (codec.cpp and sparse.cpp alike).
#pragma once

#include <cstddef>

namespace starling::codec {

// True for ranges of more than 65,536 values, unless a SerialCoding lives on this thread: below
// that, waking the team costs more than it saves.
bool code_in_parallel(size_t n);

}  // namespace starling::codec
