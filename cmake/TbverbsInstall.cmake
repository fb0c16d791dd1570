# Install rules: headers, the CMake package (tbverbsConfig.cmake, tbverbsConfigVersion.cmake,
# tbverbsTargets.cmake with the tbverbs::tbverbs target) and a pkg-config file.
#
# tbverbs is header-only, so the package is architecture independent and lives under the data
# directory (share/cmake/tbverbs, share/pkgconfig) like nlohmann_json's. The pkg-config file finds
# its prefix relative to itself, so `cmake --install build --prefix X` and relocated copies work.
include(CMakePackageConfigHelpers)

set(TBVERBS_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/tbverbs"
    CACHE STRING "Where tbverbsConfig.cmake is installed (relative to the prefix)")
set(TBVERBS_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_DATADIR}/pkgconfig"
    CACHE STRING "Where tbverbs.pc is installed (relative to the prefix)")
mark_as_advanced(TBVERBS_INSTALL_CMAKEDIR TBVERBS_INSTALL_PKGCONFIGDIR)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tbverbs
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT tbverbs_Development
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")

install(TARGETS tbverbs EXPORT tbverbsTargets)
install(EXPORT tbverbsTargets
        NAMESPACE tbverbs::
        DESTINATION ${TBVERBS_INSTALL_CMAKEDIR}
        COMPONENT tbverbs_Development)

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/tbverbsConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tbverbsConfig.cmake
  INSTALL_DESTINATION ${TBVERBS_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
# 0.x follows SameMajorVersion like any other major: 0.2 may break 0.1 only by bumping the major.
# ARCH_INDEPENDENT: a 32-bit consumer may use a package installed by a 64-bit build.
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/tbverbsConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion
  ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/tbverbsConfig.cmake ${PROJECT_BINARY_DIR}/tbverbsConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/TbverbsCollectiveLibrary.cmake
        DESTINATION ${TBVERBS_INSTALL_CMAKEDIR}
        COMPONENT tbverbs_Development)

# pkg-config: prefix relative to the .pc file (absolute include dirs are kept as they are).
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(TBVERBS_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(TBVERBS_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
if(IS_ABSOLUTE "${TBVERBS_INSTALL_PKGCONFIGDIR}")
  set(TBVERBS_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  # One "/.." per component of the pkgconfig dir (share/pkgconfig -> ${pcfiledir}/../..).
  string(REGEX REPLACE "[^/]+" ".." _tbverbs_up "${TBVERBS_INSTALL_PKGCONFIGDIR}")
  set(TBVERBS_PC_PREFIX "\${pcfiledir}/${_tbverbs_up}")
endif()
set(TBVERBS_PC_LIBS "")
foreach(_lib IN LISTS CMAKE_DL_LIBS)
  string(APPEND TBVERBS_PC_LIBS " -l${_lib}")
endforeach()
string(STRIP "${TBVERBS_PC_LIBS}" TBVERBS_PC_LIBS)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tbverbs.pc.in ${PROJECT_BINARY_DIR}/tbverbs.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tbverbs.pc
        DESTINATION ${TBVERBS_INSTALL_PKGCONFIGDIR}
        COMPONENT tbverbs_Development)
