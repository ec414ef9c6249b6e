// GPU tests run where a CUDA device is usable and skip, saying why, everywhere else (no driver, no
// device), so the suite passes on the build machines while stating that it checked nothing.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "kernels/cuda/cuda_ops.h"

// Returns early from the test case, with a warning saying why, where there is no device.
#define STARLING_SKIP_WITHOUT_CUDA()                                            \
    do {                                                                        \
        std::string skip_reason_;                                               \
        if (starling::cuda::cuda_device_count(&skip_reason_) == 0) {            \
            WARN("no CUDA device: " << skip_reason_ << " (test case skipped)"); \
            return;                                                             \
        }                                                                       \
    } while (0)
