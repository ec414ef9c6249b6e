// cuBLAS on the emulator (kernels/cuda/emulation/cublas.h).
#pragma once

#include "kernels/cuda/emulation/cublas.h"
