# Compiler launcher, warnings and sanitizers shared by every target.
find_program(VLATUNE_CCACHE ccache)
if(VLATUNE_CCACHE)
  # The torch PCH is only reused from the cache with this sloppiness (ccache manual, "Precompiled headers").
  set(_vlatune_launcher "${CMAKE_COMMAND}" -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" "${VLATUNE_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_vlatune_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_vlatune_launcher})
endif()

add_library(vlatune_warnings INTERFACE)
target_compile_options(vlatune_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)

if(VLATUNE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
