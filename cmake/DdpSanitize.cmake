# Sanitizer builds (issue 6, "Bad input"): -DDDP_SANITIZE="address;undefined" instruments the
# project's own targets only. scripts/test.sh --sanitize builds with it into build-asan/.
#
# Note [Sanitizing our targets only]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# LibTorch, Gloo and the system libraries are not rebuilt: ASan's runtime is linked into each of our
# executables and intercepts malloc/free process-wide, so heap errors in our code are caught also on
# memory that LibTorch allocated; errors inside LibTorch's own code are not. The flags are set with
# target_* commands on every target defined under the source tree (found by walking the folders at
# the end of the top-level CMakeLists.txt), never through CMAKE_CXX_FLAGS, so imported targets and
# the package consumer test (a separate CMake project) stay untouched. UBSan's vptr check is off:
# it needs the type_info of LibTorch's classes, which the uninstrumented libraries do not export in a
# form that it can compare (false "dynamic type" reports on c10 objects).
set(DDP_SANITIZE "" CACHE STRING
  "Sanitizers for the project's own targets, e.g. \"address;undefined\" (empty: none)")

function(ddp_sanitizer_flags out)
  set(flags "")
  foreach(sanitizer IN LISTS DDP_SANITIZE)
    if(NOT sanitizer MATCHES "^(address|undefined|leak)$")
      message(FATAL_ERROR "DDP_SANITIZE: unsupported sanitizer '${sanitizer}' (address, undefined, leak)")
    endif()
    list(APPEND flags -fsanitize=${sanitizer})
  endforeach()
  if("undefined" IN_LIST DDP_SANITIZE)
    # Halt on the first report (like ASan) instead of printing and going on.
    list(APPEND flags -fno-sanitize=vptr -fno-sanitize-recover=undefined)
  endif()
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

# Applies DDP_SANITIZE to every compiled target defined in `directory` and the folders below it.
function(ddp_sanitize_targets directory)
  if(NOT DDP_SANITIZE)
    return()
  endif()
  ddp_sanitizer_flags(flags)
  get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      # -O1 (after the build type's -O3, so it wins): compiles much faster and keeps reports precise;
      # -g1: line tables for the stack traces; frame pointers for ASan's fast unwinder.
      target_compile_options(${target} PRIVATE ${flags} -O1 -g1 -fno-omit-frame-pointer)
      # Libraries: PUBLIC, so that whatever links them (also an installed package's consumer) links
      # the sanitizer runtimes their objects need.
      if(type STREQUAL "EXECUTABLE")
        target_link_options(${target} PRIVATE ${flags})
      else()
        target_link_options(${target} PUBLIC ${flags})
      endif()
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    ddp_sanitize_targets(${subdirectory})
  endforeach()
endfunction()
