// WMMA on the emulator (kernels/cuda/emulation/wmma.h).
#pragma once

#include "kernels/cuda/emulation/wmma.h"
