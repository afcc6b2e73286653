# LibTorch from the torch wheel of the interpreter scripts/setup.sh recorded (never PATH's python3),
# the shared torch precompiled header, and the CUDA switch.

if(NOT VLATUNE_PYTHON)
  set(_recorded "${PROJECT_SOURCE_DIR}/.vlatune/python")
  if(NOT EXISTS "${_recorded}")
    message(FATAL_ERROR "vlatune: no torch interpreter recorded in ${_recorded}. Run scripts/setup.sh first, "
                        "or pass -DVLATUNE_PYTHON=/path/to/python (with torch==2.11.0), "
                        "or -DVLATUNE_WITH_TORCH=OFF for the torch-free tier only.")
  endif()
  file(STRINGS "${_recorded}" VLATUNE_PYTHON LIMIT_COUNT 1)
endif()
execute_process(
  COMMAND "${VLATUNE_PYTHON}" -c
          "import os, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or ''); print(os.path.dirname(os.path.dirname(torch.__file__)))"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "vlatune: '${VLATUNE_PYTHON}' cannot import torch. Run scripts/setup.sh.")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 VLATUNE_TORCH_VERSION)
list(GET _torch_info 2 _torch_cuda)
list(GET _torch_info 3 VLATUNE_SITE_PACKAGES)
message(STATUS "vlatune: torch ${VLATUNE_TORCH_VERSION} (CUDA '${_torch_cuda}') from ${VLATUNE_PYTHON}")
list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")

# CUDA: AUTO = on when this LibTorch was built with CUDA and nvcc exists.
set(VLATUNE_HAVE_CUDA OFF)
if(NOT VLATUNE_CUDA STREQUAL "OFF" AND _torch_cuda)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(VLATUNE_HAVE_CUDA ON)
  elseif(VLATUNE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "vlatune: VLATUNE_CUDA=ON but no nvcc was found (set CMAKE_CUDA_COMPILER)")
  endif()
elseif(VLATUNE_CUDA STREQUAL "ON")
  message(FATAL_ERROR "vlatune: VLATUNE_CUDA=ON but torch ${VLATUNE_TORCH_VERSION} has no CUDA")
endif()

# The GPUs the .cu files build for, in TORCH_CUDA_ARCH_LIST's form: machine code (SASS) for A100 (8.0), A10 /
# RTX 30 (8.6), L40S / RTX 4090 / L4 (8.9) and H100 / H200 (9.0), plus compute_90 PTX that the driver compiles for
# newer GPUs (Blackwell). Only kernels/ has .cu files, so only they pay for the extra architectures; every device
# feature newer than sm_80 is guarded in the code and checked at run time (kernels/device_caps.h).
# A developer build for one GPU: -DVLATUNE_CUDA_ARCHS=9.0 (README "Building by hand").
set(VLATUNE_CUDA_ARCHS "8.0;8.6;8.9;9.0+PTX" CACHE STRING
    "CUDA architectures of the .cu files (TORCH_CUDA_ARCH_LIST form, e.g. 9.0 for an H100-only build)")
if(VLATUNE_HAVE_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80)   # for enable_language's test compile only (the default, 75, is gone in CUDA 13)
  endif()
  set(TORCH_CUDA_ARCH_LIST "${VLATUNE_CUDA_ARCHS}")
  message(STATUS "vlatune: CUDA architectures ${VLATUNE_CUDA_ARCHS}")
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  find_package(CUDAToolkit REQUIRED)
endif()

# Torch's own CMake looks for Python and for the toolkit: give it our interpreter, and the architectures through
# TORCH_CUDA_ARCH_LIST (it adds one -gencode per entry to CMAKE_CUDA_FLAGS and ignores, with a warning, a
# CMAKE_CUDA_ARCHITECTURES left set).
set(Python_EXECUTABLE "${VLATUNE_PYTHON}")
unset(CMAKE_CUDA_ARCHITECTURES)
# The wheel's CUDA libraries (cuBLAS, CUPTI, NCCL, NVRTC, ...) live in site-packages/nvidia/*/lib; torch's own
# libraries find them through their RPATH. We link the same copies, NVRTC included (torch's CMake would take the
# toolkit's), so one process never holds two copies and the runtime search path has one consistent order.
file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${VLATUNE_SITE_PACKAGES}/nvidia/*/lib")
set(VLATUNE_NVIDIA_LIB_DIRS ${_nvidia_lib_dirs})
if(VLATUNE_HAVE_CUDA)
  # Point the toolkit's imported CUDA:: targets (which torch's CMake links) at the wheel's copies.
  foreach(_lib cudart nvrtc cublas cublasLt cufft curand cusolver cusparse cupti nvJitLink)
    file(GLOB _wheel_lib "${VLATUNE_SITE_PACKAGES}/nvidia/*/lib/lib${_lib}.so.[0-9]*")
    list(FILTER _wheel_lib EXCLUDE REGEX "alt\\.so")
    if(TARGET CUDA::${_lib} AND _wheel_lib)
      list(GET _wheel_lib 0 _wheel_lib)
      set_target_properties(CUDA::${_lib} PROPERTIES IMPORTED_LOCATION "${_wheel_lib}")
    endif()
  endforeach()
  find_library(CUDA_NVRTC_LIB NAMES libnvrtc.so.13 nvrtc PATHS ${VLATUNE_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
endif()
find_package(Torch REQUIRED)
if(VLATUNE_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES OFF)  # -gencode comes from torch's CMAKE_CUDA_FLAGS (VLATUNE_CUDA_ARCHS)
endif()
message(STATUS "vlatune: CUDA kernels/CUPTI/NVTX/NCCL: ${VLATUNE_HAVE_CUDA}")

# The linker resolves torch's own dependencies in the wheel's library folders too.

# One interface target every torch-tier target links: torch, its flags, our rpaths, CUDA definitions.
add_library(vlatune_torch INTERFACE)
target_link_libraries(vlatune_torch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(vlatune_torch INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${TORCH_CXX_FLAGS}>)
target_compile_definitions(vlatune_torch INTERFACE VLATUNE_TORCH_VERSION="${VLATUNE_TORCH_VERSION}")
foreach(_d IN LISTS VLATUNE_NVIDIA_LIB_DIRS)
  target_link_options(vlatune_torch INTERFACE "LINKER:-rpath-link,${_d}")
endforeach()

# One precompiled <torch/torch.h>, built once and reused by every torch-tier target (REUSE_FROM): a TU that
# includes torch/torch.h costs ~15-24 s here without it, ~9 s with it.
add_library(vlatune_torch_pch STATIC "${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp")
target_link_libraries(vlatune_torch_pch PUBLIC vlatune_torch)
target_precompile_headers(vlatune_torch_pch PRIVATE "${PROJECT_SOURCE_DIR}/cmake/torch_pch.h")
if(VLATUNE_CCACHE)
  target_compile_options(vlatune_torch_pch PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fpch-preprocess>)
endif()

# vlatune_use_torch_pch(target): the target's C++ files reuse the shared torch PCH.
function(vlatune_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM vlatune_torch_pch)
  if(VLATUNE_CCACHE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fpch-preprocess>)
  endif()
endfunction()

# CUPTI and NCCL: the copies inside the torch wheel (torch loads these; one process must never hold two).
# NVTX 3 is header-only (nvtx3/ in the CUDA toolkit).
if(VLATUNE_HAVE_CUDA)
  find_library(VLATUNE_CUPTI_LIBRARY NAMES libcupti.so.13 cupti PATHS ${VLATUNE_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
  find_path(VLATUNE_CUPTI_INCLUDE cupti.h
            PATHS "${VLATUNE_SITE_PACKAGES}/nvidia/cu13/include" "${CUDAToolkit_INCLUDE_DIRS}"
                  "${CUDAToolkit_LIBRARY_ROOT}/extras/CUPTI/include" NO_DEFAULT_PATH)
  find_library(VLATUNE_NCCL_LIBRARY NAMES libnccl.so.2 nccl PATHS ${VLATUNE_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
  find_path(VLATUNE_NCCL_INCLUDE nccl.h PATHS "${VLATUNE_SITE_PACKAGES}/nvidia/nccl/include"
            "${CUDAToolkit_INCLUDE_DIRS}" NO_DEFAULT_PATH)
  foreach(_v VLATUNE_CUPTI_LIBRARY VLATUNE_CUPTI_INCLUDE VLATUNE_NCCL_LIBRARY VLATUNE_NCCL_INCLUDE)
    if(NOT ${_v})
      message(FATAL_ERROR "vlatune: ${_v} not found in the torch wheel (${VLATUNE_SITE_PACKAGES}/nvidia) or the "
                          "CUDA toolkit; configure with -DVLATUNE_CUDA=OFF to build without CUDA")
    endif()
  endforeach()
  find_library(VLATUNE_CUDART_LIBRARY NAMES libcudart.so.13 cudart PATHS ${VLATUNE_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
  if(NOT VLATUNE_CUDART_LIBRARY)
    set(VLATUNE_CUDART_LIBRARY CUDA::cudart)
  endif()
  add_library(vlatune_cudart INTERFACE)   # the CUDA runtime torch loads, with the toolkit's headers
  target_include_directories(vlatune_cudart INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(vlatune_cudart INTERFACE "${VLATUNE_CUDART_LIBRARY}")
  add_library(vlatune_cupti INTERFACE)
  target_include_directories(vlatune_cupti INTERFACE "${VLATUNE_CUPTI_INCLUDE}")
  target_link_libraries(vlatune_cupti INTERFACE "${VLATUNE_CUPTI_LIBRARY}" vlatune_cudart)
  add_library(vlatune_nccl INTERFACE)
  target_include_directories(vlatune_nccl INTERFACE "${VLATUNE_NCCL_INCLUDE}")
  target_link_libraries(vlatune_nccl INTERFACE "${VLATUNE_NCCL_LIBRARY}")
  message(STATUS "vlatune: CUPTI ${VLATUNE_CUPTI_LIBRARY}, NCCL ${VLATUNE_NCCL_LIBRARY}")

  # cuDNN (the wheel's copy, which torch loads) and the header-only cudnn_frontend (PyPI nvidia-cudnn-frontend,
  # installed by scripts/setup.sh; on the GPU machine from .deps, scripts/pack-deps.sh): the joint attention's
  # padding-mask kernels (kernels/cudnn_sdpa.h). Optional: without them that attention runs FlashAttention-2.
  find_library(VLATUNE_CUDNN_LIBRARY NAMES libcudnn.so.9 PATHS ${VLATUNE_NVIDIA_LIB_DIRS} NO_DEFAULT_PATH)
  find_path(VLATUNE_CUDNN_INCLUDE cudnn.h PATHS "${VLATUNE_SITE_PACKAGES}/nvidia/cudnn/include"
            "${VLATUNE_SITE_PACKAGES}/nvidia/cu13/include" NO_DEFAULT_PATH)
  find_path(VLATUNE_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h
            PATHS "${VLATUNE_SITE_PACKAGES}/include" "${PROJECT_SOURCE_DIR}/.deps/cudnn_frontend/include"
            NO_DEFAULT_PATH)
  if(VLATUNE_CUDNN_LIBRARY AND VLATUNE_CUDNN_INCLUDE AND VLATUNE_CUDNN_FRONTEND_INCLUDE)
    set(VLATUNE_HAVE_CUDNN_FRONTEND ON)
    add_library(vlatune_cudnn_frontend INTERFACE)
    target_include_directories(vlatune_cudnn_frontend SYSTEM INTERFACE "${VLATUNE_CUDNN_FRONTEND_INCLUDE}"
                                                                         "${VLATUNE_CUDNN_INCLUDE}")
    target_link_libraries(vlatune_cudnn_frontend INTERFACE "${VLATUNE_CUDNN_LIBRARY}" vlatune_cudart)
    target_compile_definitions(vlatune_cudnn_frontend INTERFACE VLATUNE_HAVE_CUDNN_FRONTEND=1)
    message(STATUS "vlatune: cuDNN ${VLATUNE_CUDNN_LIBRARY}, frontend ${VLATUNE_CUDNN_FRONTEND_INCLUDE}")
  else()
    set(VLATUNE_HAVE_CUDNN_FRONTEND OFF)
    message(STATUS "vlatune: no cudnn_frontend.h or libcudnn (run scripts/setup.sh): the joint attention uses "
                   "FlashAttention-2")
  endif()
endif()
