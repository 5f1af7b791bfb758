# Included by the consumers' scripts (cmake -P). A CUDA LibTorch (CUDA_ROOT set, the toolkit of the
# build under test: tests/package/CMakeLists.txt): its CMake config needs the toolkit in every
# project that finds it, and TORCH_CUDA_ARCH_LIST keeps it from probing for a GPU. Sets cuda_args,
# the consumer's configure arguments (empty with a CPU LibTorch).
set(cuda_args "")
if(CUDA_ROOT)
  set(cuda_args "-DCUDAToolkit_ROOT=${CUDA_ROOT}" "-DCUDA_TOOLKIT_ROOT_DIR=${CUDA_ROOT}")
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} 9.0)
  endif()
endif()
