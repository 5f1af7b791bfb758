# Script mode (cmake -P): install, configure the consumer, build it, run it, check its output.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
  set(step_error "${err}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${DDP_BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/ddp/ddpConfig.cmake")
  message(FATAL_ERROR "install did not produce lib/cmake/ddp/ddpConfig.cmake under ${prefix}")
endif()
# The installed headers are closed: every project header an installed header includes is installed
# (see Note [Installed headers] in cmake/DdpInstall.cmake), and none includes nlohmann-json.
file(GLOB_RECURSE installed_headers RELATIVE "${prefix}/include" "${prefix}/include/*.h")
if(NOT installed_headers)
  message(FATAL_ERROR "no headers installed under ${prefix}/include")
endif()
foreach(header IN LISTS installed_headers)
  file(STRINGS "${prefix}/include/${header}" includes REGEX "^#include [\"<]")
  foreach(line IN LISTS includes)
    if(line MATCHES "^#include \"((ddp|samplers)/[^\"]+)\"")
      set(included "${CMAKE_MATCH_1}")  # set by MATCHES, so read in a second step
      if(NOT EXISTS "${prefix}/include/${included}")
        message(FATAL_ERROR "installed ${header} includes ${included}, which is not installed: "
                            "add it to DDP_PUBLIC_HEADERS in cmake/DdpInstall.cmake, or move the include to a .cpp")
      endif()
    endif()
    if(line MATCHES "nlohmann/")
      message(FATAL_ERROR "installed ${header} includes nlohmann-json, which users need not have: ${line}")
    endif()
  endforeach()
endforeach()
foreach(internal ddp/base/files.h ddp/base/json_text.h ddp/bucket.h)
  if(EXISTS "${prefix}/include/${internal}")
    message(FATAL_ERROR "the internal header ${internal} was installed: only the public API is")
  endif()
endforeach()

# The README's C++ examples, extracted into one source file that the consumer compiles against the
# installed headers (see readme_examples.cmake).
include("${CMAKE_CURRENT_LIST_DIR}/readme_examples.cmake")
extract_readme_examples("${README}" "${WORK_DIR}/readme_examples.cpp")
# The port of examples/mnist_port changes exactly the lines the README's "Port your program" lists.
check_port_diff("${MNIST_PORT_DIR}/mnist_serial.cpp" "${MNIST_PORT_DIR}/mnist_port.cpp" "${WORK_DIR}")

run_step("configure consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
  -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}"
  "-DREADME_EXAMPLES=${WORK_DIR}/readme_examples.cpp" "-DMNIST_PORT_DIR=${MNIST_PORT_DIR}")
# The package configures without repeating a warning, though find_package(ddp) runs twice (the
# consumer and examples/mnist_port each call it) and the consumer found Torch first.
string(REGEX MATCHALL "CMake Warning[^\n]*\n[^\n]*\n[^\n]*" warnings "${step_output}\n${step_error}")
set(seen "")
foreach(warning IN LISTS warnings)
  list(FIND seen "${warning}" earlier)
  if(NOT earlier EQUAL -1)
    message(FATAL_ERROR "configuring against the installed package repeats a warning:\n${warning}")
  endif()
  list(APPEND seen "${warning}")
endforeach()
run_step("build consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("run consumer" "${WORK_DIR}/build/ddp_consumer")
if(NOT step_output MATCHES "ddp ${EXPECTED_VERSION} ")
  message(FATAL_ERROR "consumer printed an unexpected line: ${step_output}")
endif()
message(STATUS "consumer ran: ${step_output}")
