// Host-side helpers shared by the launchers.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace rocm_mla {

// The platform's wave size (64 on CDNA, 32 on NVIDIA), asked of the driver, never assumed.
inline int wave_size(int device) {
  int ws = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&ws, cudaDevAttrWarpSize, device));
  return ws;
}

}  // namespace rocm_mla
