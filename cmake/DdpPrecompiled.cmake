# Note [Precompiled LibTorch headers]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A translation unit that includes LibTorch spends most of its 35-57 s parsing LibTorch's headers
# (docs/benchmarks.md has the ten slowest units with and without). So cmake/torch_pch.h is
# precompiled twice: once for the ddp library (with c10d's Gloo backend, whose headers are the
# library's private include), once in ddp_torch_pch for every other target that links LibTorch,
# which reuse it (REUSE_FROM: one precompiled header for the tests, examples and benchmarks). GCC
# uses a precompiled header only when it was built with the same options, so the reusing targets
# get theirs from linking ddp as ddp_torch_pch does; -Winvalid-pch (CMake's) with -Werror makes a
# mismatch an error rather than a silent slowdown. Torch-free targets (the launcher, ddp_base) never
# see it, and neither does a torch-free source of a target that links LibTorch: loading the
# header costs such a unit 25 s of instantiation and code generation (4 s becomes 29 s, measured on
# ddp/distributed/detail/collective_log.cpp), where a unit that includes LibTorch saves 45% (46 s
# becomes 25 s, ddp/parallel/detail/reducer.cpp). Whether a source sees LibTorch is read from its
# includes, following the project's headers. -DDDP_PRECOMPILED_HEADERS=OFF builds without.
option(DDP_PRECOMPILED_HEADERS "Precompile LibTorch's headers (see Note [Precompiled LibTorch headers])" ON)

# Whether `target` links LibTorch, directly or through a project target.
function(_ddp_links_torch target out)
  set(${out} FALSE PARENT_SCOPE)
  get_target_property(libraries ${target} LINK_LIBRARIES)
  if(NOT libraries)
    return()
  endif()
  foreach(library IN LISTS libraries)
    if(library STREQUAL "torch" OR library STREQUAL "ddp" OR library STREQUAL "ddp::ddp")
      set(${out} TRUE PARENT_SCOPE)
      return()
    endif()
    if(TARGET ${library} AND NOT library MATCHES "::")
      _ddp_links_torch(${library} nested)
      if(nested)
        set(${out} TRUE PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
endfunction()

# Whether `file` includes LibTorch, directly or through the project's headers (cached per header).
function(_ddp_sees_torch file out)
  get_property(known GLOBAL PROPERTY "DDP_SEES_TORCH_${file}" SET)
  if(known)
    get_property(answer GLOBAL PROPERTY "DDP_SEES_TORCH_${file}")
    set(${out} ${answer} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "DDP_SEES_TORCH_${file}" FALSE)  # an include cycle ends here
  set(answer FALSE)
  file(STRINGS "${file}" includes REGEX "^#include [<\"]")
  foreach(line IN LISTS includes)
    if(line MATCHES "^#include <(torch|ATen|c10)/")
      set(answer TRUE)
      break()
    endif()
    if(line MATCHES "^#include \"([^\"]+)\"" AND EXISTS "${PROJECT_SOURCE_DIR}/${CMAKE_MATCH_1}")
      _ddp_sees_torch("${PROJECT_SOURCE_DIR}/${CMAKE_MATCH_1}" nested)
      if(nested)
        set(answer TRUE)
        break()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "DDP_SEES_TORCH_${file}" ${answer})
  set(${out} ${answer} PARENT_SCOPE)
endfunction()

# Marks the sources of `target` that never include LibTorch: they compile without the header.
function(_ddp_skip_torch_free_sources target)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  foreach(source IN LISTS sources)
    if(NOT source MATCHES "\\.cpp$" OR source MATCHES "^\\$<")
      continue()
    endif()
    if(NOT IS_ABSOLUTE "${source}")
      set(source "${source_dir}/${source}")
    endif()
    _ddp_sees_torch("${source}" sees_torch)
    if(NOT sees_torch)
      set_source_files_properties("${source}" TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

# Catch tests that link LibTorch get the prelude through the precompiled header, the others by
# -include (see Note [Catch and LibTorch CHECK]); called last, once every target exists.
function(ddp_precompile_torch_headers directory)
  get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY)$" OR target STREQUAL "ddp_torch_pch")
      continue()
    endif()
    _ddp_links_torch(${target} links_torch)
    get_target_property(catch_test ${target} DDP_CATCH_TEST)
    if(DDP_PRECOMPILED_HEADERS AND links_torch)
      target_precompile_headers(${target} REUSE_FROM ddp_torch_pch)
      _ddp_skip_torch_free_sources(${target})
    elseif(catch_test)
      target_compile_options(${target} PRIVATE -include ${PROJECT_SOURCE_DIR}/tests/catch_prelude.h)
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    ddp_precompile_torch_headers(${subdirectory})
  endforeach()
endfunction()

if(DDP_PRECOMPILED_HEADERS)
  target_precompile_headers(ddp PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
  _ddp_skip_torch_free_sources(ddp)
  file(WRITE ${PROJECT_BINARY_DIR}/ddp_torch_pch.cpp "// The precompiled header's own unit (cmake/DdpPrecompiled.cmake).\n")
  add_library(ddp_torch_pch OBJECT ${PROJECT_BINARY_DIR}/ddp_torch_pch.cpp)
  target_link_libraries(ddp_torch_pch PRIVATE ddp)
  target_precompile_headers(ddp_torch_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
  ddp_set_warnings(ddp_torch_pch)
endif()
