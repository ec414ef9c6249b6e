// The CUDA runtime as seen by kernel and host source built on the emulator
// (kernels/cuda/emulation/README.md): the device side and the runtime API.
#pragma once

#include "kernels/cuda/emulation/device.h"
#include "kernels/cuda/emulation/runtime.h"
