# Note [CUDA LibTorch builds]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The same sources build against a CPU-only LibTorch (the default, what the tests run on) and against
# a CUDA LibTorch (scripts/build-cuda.sh; scripts/gpu-check.sh on a GPU machine). TorchConfig.cmake
# decides which one it is: a CUDA LibTorch runs Caffe2's FindCUDA/CUDAToolkit (it needs nvcc and the
# CUDA runtime, e.g. -DCUDAToolkit_ROOT=/usr/local/cuda) and sets CAFFE2_USE_CUDA. Then:
#   - DDP_WITH_CUDA is defined (PRIVATE) on the ddp library, so ddp/runtime/detail/cuda_support.cpp compiles the
#     CUDA calls (device binding, caching-allocator statistics, stream synchronisation);
#   - USE_C10D_NCCL is defined (PRIVATE) on the ddp library, so process_group.cpp compiles
#     c10d::ProcessGroupNCCL. Its header includes <nccl.h>, which LibTorch does not ship: it comes
#     from the nvidia-nccl wheel beside torch (site-packages/nvidia/nccl/include), from the CUDA
#     toolkit or from /usr/include. No public header of ours includes CUDA or NCCL headers, so
#     consumers of ddp::ddp never need them.
# ProcessGroupNCCL's code itself is in libtorch_cuda.so; we link nothing extra.
function(ddp_configure_cuda target)
  if(NOT CAFFE2_USE_CUDA)
    set(DDP_WITH_CUDA OFF PARENT_SCOPE)
    return()
  endif()
  set(DDP_WITH_CUDA ON PARENT_SCOPE)
  get_filename_component(site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  find_path(DDP_NCCL_INCLUDE_DIR nccl.h
    HINTS "${site_packages}/nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_INCLUDE_DIRS}
    DOC "Folder that holds nccl.h (the nvidia-nccl wheel beside torch, or the CUDA toolkit)")
  if(NOT DDP_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "This LibTorch has CUDA but nccl.h was not found: install the nvidia-nccl wheel "
      "next to torch (pip install torch pulls it in) or pass -DDDP_NCCL_INCLUDE_DIR=/path/to/include")
  endif()
  # The CUDA headers of the wheels (cublas_v2.h and friends), for a toolkit that lacks some of them.
  set(extra_includes "${DDP_NCCL_INCLUDE_DIR}")
  foreach(dir "${site_packages}/nvidia/cu13/include" "${site_packages}/nvidia/cu12/include")
    if(EXISTS "${dir}")
      list(APPEND extra_includes "${dir}")
    endif()
  endforeach()
  target_include_directories(${target} SYSTEM PRIVATE ${extra_includes})
  target_compile_definitions(${target} PRIVATE USE_C10D_NCCL DDP_WITH_CUDA)
  message(STATUS "ddp: CUDA LibTorch; NCCL headers in ${DDP_NCCL_INCLUDE_DIR}")
endfunction()
