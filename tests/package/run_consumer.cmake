# Script mode (cmake -P): install, configure the consumer, build it, run it, check its output.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit ${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

run_step("install" ${CMAKE_COMMAND} --install "${DDP_BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/ddp/ddpConfig.cmake")
  message(FATAL_ERROR "install did not produce lib/cmake/ddp/ddpConfig.cmake under ${prefix}")
endif()
run_step("configure consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
  -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_PREFIX_PATH=${prefix}" "-DTorch_DIR=${TORCH_DIR}")
run_step("build consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("run consumer" "${WORK_DIR}/build/ddp_consumer")
if(NOT step_output MATCHES "ddp ${EXPECTED_VERSION} ")
  message(FATAL_ERROR "consumer printed an unexpected line: ${step_output}")
endif()
message(STATUS "consumer ran: ${step_output}")
