# Debian packages from CPack (`cpack -G DEB` in the build folder): ddp-launch (the launcher and its
# plugins), libddp<major.minor> (the library) and libddp-dev (the headers, the link name and the
# CMake package: find_package(ddp)). Installed under /usr. LibTorch is no Debian package: the
# library and the rendezvous plugin find the LibTorch they were built with by their run path (See
# ddp/CMakeLists.txt), so the packages are for machines that have that LibTorch at the same place.
# tests/package/deb_test.sh installs them into a copy-on-write root, uses them and removes them.

# The Debian package that holds `file` (a shared library found at configure time), in `out`; empty
# when dpkg does not know it.
function(ddp_deb_package_of file out)
  set(${out} "" PARENT_SCOPE)
  if(NOT file)
    return()
  endif()
  get_filename_component(real "${file}" REALPATH)
  execute_process(COMMAND dpkg-query -S "${real}" OUTPUT_VARIABLE owner ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND owner MATCHES "^([^:, ]+)")
    set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
  endif()
endfunction()

# "pkg1, pkg2" for the libraries a component links, those dpkg knows.
function(ddp_deb_depends out)
  set(packages "")
  foreach(file IN LISTS ARGN)
    ddp_deb_package_of("${file}" package)
    if(package)
      list(APPEND packages "${package}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES packages)
  list(JOIN packages ", " text)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

get_target_property(ddp_spdlog_library spdlog::spdlog LOCATION)
set(ddp_fmt_library "")
if(TARGET fmt::fmt)
  get_target_property(ddp_fmt_library fmt::fmt LOCATION)
endif()
# FindOpenSSL's imported target lives in launcher/'s scope; its cache variable is everywhere.
set(ddp_crypto_library "${OPENSSL_CRYPTO_LIBRARY}")

set(library_package "libddp${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
ddp_deb_depends(library_depends "${ddp_spdlog_library}" "${ddp_fmt_library}" "${DDP_XXHASH_LIBRARY}")
ddp_deb_depends(launcher_depends "${ddp_spdlog_library}" "${ddp_fmt_library}" "${ddp_crypto_library}"
  "${DDP_HTTPLIB_LIBRARY}")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddp)
set(CPACK_PACKAGE_VENDOR "the ddp team")
set(CPACK_PACKAGE_CONTACT "the ddp team <ddp@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Data-parallel training for LibTorch: DistributedDataParallel and a torchrun-style launcher in C++")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL launcher library dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_LAUNCHER_PACKAGE_NAME ddp-launch)
set(CPACK_DEBIAN_LAUNCHER_PACKAGE_DEPENDS "${launcher_depends}")
set(CPACK_DEBIAN_LIBRARY_PACKAGE_NAME "${library_package}")
set(CPACK_DEBIAN_LIBRARY_PACKAGE_DEPENDS "${library_depends}")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddp-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${library_package} (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_LAUNCHER_DESCRIPTION "ddp_launch, a torchrun-style launcher, and its plugins")
set(CPACK_COMPONENT_LIBRARY_DESCRIPTION "libddp, DistributedDataParallel for LibTorch")
set(CPACK_COMPONENT_DEV_DESCRIPTION "libddp's headers and its CMake package (find_package(ddp))")
include(CPack)
