# Install rules and the exported package: find_package(ddp) gives ddp::ddp.
include(CMakePackageConfigHelpers)

install(TARGETS ddp EXPORT ddpTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Note [Installed headers]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# Only the public API is installed: the headers a user includes, and the headers those include (the
# package test checks that every #include "ddp/..." of an installed header is installed too). The
# library's internals (bucket.h, cuda_support.h, ddp/base/files.h, json_text.h, error_file.h, ...)
# stay in the source tree, so that they can change without breaking anyone. A new public header is
# added here. Headers keep their project-root paths: #include "ddp/..." and "samplers/...".
set(DDP_PUBLIC_HEADERS
  # What a training program includes.
  ddp/ddp.h                    # the whole API in one include
  ddp/process_group.h
  ddp/distributed_data_parallel.h
  ddp/data_parallel.h
  ddp/checkpoint.h
  ddp/sync_batch_norm.h
  ddp/comm_hooks.h
  ddp/comm_hook.h
  ddp/comm_hook_state.h
  ddp/powersgd.h
  ddp/model_averaging.h
  ddp/run_main.h
  ddp/agent_channel.h          # ProgressReporter
  ddp/log.h
  ddp/version.h
  ddp/ddp_stats.h
  ddp/amp/autocast.h
  ddp/amp/grad_scaler.h
  ddp/zero_redundancy_optimizer.h
  ddp/fault_tolerant.h
  ddp/membership.h
  ddp/live_environment.h
  samplers/distributed_sampler.h
  samplers/reshard.h
  ddp/base/error.h
  ddp/base/str.h
  # What those include.
  ddp/collective_log.h         # process_group.h
  ddp/base/report_files.h      # collective_log.h
  ddp/topology.h               # process_group.h
  ddp/sliced_allreduce.h       # process_group.h
  ddp/base/agent_message.h     # agent_channel.h
  ddp/base/environment.h       # agent_channel.h
  ddp/amp/grad_scaler_state.h  # checkpoint.h, grad_scaler.h
  ddp/amp/precision.h)         # autocast.h
foreach(header IN LISTS DDP_PUBLIC_HEADERS)
  get_filename_component(folder ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${folder})
endforeach()
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
