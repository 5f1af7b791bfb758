# Install rules and the exported package: find_package(ddp) gives ddp::ddp.
include(CMakePackageConfigHelpers)

# Components for the Debian packages (cmake/DdpPackage.cmake): the run-time library, and for
# development its link name, headers and CMake package.
install(TARGETS ddp EXPORT ddpTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT library NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT library
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Note [Installed headers]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# The public API is installed by folder: every header of ddp/ and samplers/ outside a detail/
# folder (see Note [Library folders] in ddp/CMakeLists.txt). What a folder keeps to itself lives in
# its detail/ folder, in namespace ddp::detail, and stays in the source tree, so that it can change
# without breaking anyone; no public header includes it (the package test checks that the
# installed headers are closed). Headers keep their project-root paths: "ddp/..." and "samplers/...".
foreach(tree ddp samplers)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${tree}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${tree}
    COMPONENT dev
    FILES_MATCHING PATTERN "*.h"
    PATTERN detail EXCLUDE)
endforeach()
install(EXPORT ddpTargets NAMESPACE ddp:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp COMPONENT dev)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddpConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ddpConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ddpConfig.cmake ${PROJECT_BINARY_DIR}/ddpConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddp COMPONENT dev)
