// The CUDA runtime API on the emulator (kernels/cuda/emulation/runtime.h).
#pragma once

#include "kernels/cuda/emulation/runtime.h"
