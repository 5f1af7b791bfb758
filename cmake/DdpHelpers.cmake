# Helpers shared by every folder of the project.

# Warnings for the project's own code only: third-party headers come in as SYSTEM includes.
function(ddp_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(DDP_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # GCC 12 in C++20 mode at -O3 reports -Wrestrict, -Wstringop-overflow and -Warray-bounds inside
  # std::string's own inlined copies when a literal is joined to a string (`"p" + std::to_string(i)`,
  # `dir + "/" + name`; GCC bugs 105329 and 105651): false positives that its C++17 mode (torch
  # 2.13) does not show. The C++20 build (torch 2.14) turns those three off with GCC 12 rather than
  # rewriting correct code around the compiler, as was done twice before (benchmarks/harness.cpp,
  # benchmarks/scenarios/train.cpp).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13
     AND CMAKE_CXX_STANDARD GREATER_EQUAL 20)
    target_compile_options(${target} PRIVATE -Wno-restrict -Wno-stringop-overflow -Wno-array-bounds)
  endif()
  # GCC warns when a class outside the main file has a member whose type is in an unnamed namespace
  # (-Wsubobject-linkage: meant for headers). In a unity batch (Note [Unity builds]) every source is
  # outside the unit's main file, so a .cpp's private Impl with such a member would warn there only.
  if(DDP_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
endfunction()

# Note [Gloo headers]
# ~~~~~~~~~~~~~~~~~~~
# LibTorch's wheels and zips ship libtorch_cpu with Gloo compiled in, but not Gloo's headers, which
# c10d/ProcessGroupGloo.hpp includes. Debian's libgloo-dev provides headers that are compatible with
# the declarations ProcessGroupGloo.hpp needs (we only pass Gloo devices around by shared_ptr). They
# are a PRIVATE include of the ddp library: no public header of ours includes ProcessGroupGloo.hpp,
# so consumers of ddp::ddp never need Gloo's headers.
function(ddp_find_gloo_headers)
  find_path(DDP_GLOO_INCLUDE_DIR gloo/rendezvous/store.h
    DOC "Folder that holds gloo/rendezvous/store.h (Debian: libgloo-dev)")
  if(NOT DDP_GLOO_INCLUDE_DIR)
    message(FATAL_ERROR "Gloo headers not found (gloo/rendezvous/store.h): install Debian's libgloo-dev "
      "(scripts/setup.sh does) or pass -DDDP_GLOO_INCLUDE_DIR=/path/to/include")
  endif()
endfunction()

# A Catch2 test executable; tests are registered by the caller with add_test so that each
# can set its own timeout and labels.
function(ddp_add_catch_test target)
  add_executable(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE ddp_catch_main)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  # The prelude comes in last (ddp_precompile_torch_headers): See Note [Catch and LibTorch CHECK].
  set_property(TARGET ${target} PROPERTY DDP_CATCH_TEST TRUE)
  ddp_set_warnings(${target})
endfunction()
