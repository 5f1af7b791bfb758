# Install rules and the exported package: find_package(ddp) gives ddp::ddp.
include(CMakePackageConfigHelpers)

install(TARGETS ddp EXPORT ddpTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Public headers keep their project-root paths: #include "ddp/..." and "samplers/...".
install(DIRECTORY ${PROJECT_SOURCE_DIR}/ddp ${PROJECT_SOURCE_DIR}/samplers
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h"
  PATTERN "detail" EXCLUDE)
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
