# Builds and runs one consumer project (cmake -P). Parameters (-D):
#   MODE          install | add_subdirectory | fetchcontent | find_package | pkg_config
#   TBVERBS_SOURCE_DIR, CONSUMER_DIR (this folder), WORK_DIR (scratch, wiped), PREFIX (install prefix)
#   GENERATOR, CXX_COMPILER, CXX_FLAGS, CXX_STANDARD (20, 23), VERSION (expected package version)
#   COLLECTIVE    true: also build and run collective_main.cpp on tbverbs_add_collective_library
cmake_minimum_required(VERSION 3.20)

function(run)
  string(REPLACE ";" " " _shown "${ARGN}")
  message("> ${_shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${_shown}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

foreach(v MODE TBVERBS_SOURCE_DIR CONSUMER_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT DEFINED CXX_STANDARD OR CXX_STANDARD STREQUAL "")
  set(CXX_STANDARD 20)
endif()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

set(_common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
            -DCMAKE_BUILD_TYPE=Debug)
# What a consumer must see when it runs main.cpp.
set(_expected_output "failed with EINVAL")

if(MODE STREQUAL "install")
  # What README.md tells users: configure with TBVERBS_LIBRARY_ONLY, install to a prefix (the
  # build step is a no-op that keeps this honest if install rules ever need built files).
  file(REMOVE_RECURSE ${PREFIX})
  run(${CMAKE_COMMAND} -S ${TBVERBS_SOURCE_DIR} -B ${WORK_DIR}/build ${_common} -DTBVERBS_LIBRARY_ONLY=ON)
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/build --prefix ${PREFIX})
  foreach(f include/tbverbs/config.hpp include/tbverbs/error.hpp include/tbverbs/result.hpp
            share/cmake/tbverbs/tbverbsConfig.cmake share/cmake/tbverbs/tbverbsConfigVersion.cmake
            share/cmake/tbverbs/tbverbsTargets.cmake share/cmake/tbverbs/TbverbsCollectiveLibrary.cmake
            share/pkgconfig/tbverbs.pc)
    if(NOT EXISTS ${PREFIX}/${f})
      message(FATAL_ERROR "not installed: ${PREFIX}/${f}")
    endif()
  endforeach()
  # Every header of the source tree is installed.
  file(GLOB_RECURSE _src RELATIVE ${TBVERBS_SOURCE_DIR}/include ${TBVERBS_SOURCE_DIR}/include/*.hpp)
  foreach(f IN LISTS _src)
    if(NOT EXISTS ${PREFIX}/include/${f})
      message(FATAL_ERROR "header not installed: ${f}")
    endif()
  endforeach()
  message("installed tbverbs into ${PREFIX}")
  return()
endif()

if(MODE STREQUAL "pkg_config")
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf REQUIRED)
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  set(ENV{PKG_CONFIG_LIBDIR} "${PREFIX}/share/pkgconfig")
  run(${PKG_CONFIG_EXECUTABLE} --modversion tbverbs)
  string(STRIP "${run_output}" _version)
  if(DEFINED VERSION AND NOT _version STREQUAL VERSION)
    message(FATAL_ERROR "pkg-config --modversion: '${_version}', expected '${VERSION}'")
  endif()
  run(${PKG_CONFIG_EXECUTABLE} --cflags tbverbs)
  string(STRIP "${run_output}" _cflags)
  if(NOT _cflags MATCHES "^-I([^ ]+)$")
    message(FATAL_ERROR "pkg-config --cflags: expected exactly one -I<dir>, got '${_cflags}'")
  endif()
  get_filename_component(_incdir "${CMAKE_MATCH_1}" REALPATH)
  get_filename_component(_want "${PREFIX}/include" REALPATH)
  if(NOT _incdir STREQUAL _want)
    message(FATAL_ERROR "pkg-config include dir '${_incdir}' is not the install prefix's '${_want}'")
  endif()
  run(${PKG_CONFIG_EXECUTABLE} --libs tbverbs)
  string(STRIP "${run_output}" _libs)
  separate_arguments(_libs UNIX_COMMAND "${_libs}")
  separate_arguments(_flags UNIX_COMMAND "${CXX_FLAGS}")
  # Build main.cpp the way a Makefile user would: $(CXX) -std=c++20 $(pkg-config --cflags --libs tbverbs).
  run(${CXX_COMPILER} ${_flags} -std=c++${CXX_STANDARD} -Wall -Wextra -Wpedantic -Werror -I${_incdir}
      ${CONSUMER_DIR}/main.cpp -o ${WORK_DIR}/tbverbs_consumer ${_libs})
  run(${WORK_DIR}/tbverbs_consumer)
  if(NOT run_output MATCHES "${_expected_output}")
    message(FATAL_ERROR "unexpected consumer output (wanted '${_expected_output}')")
  endif()
  return()
endif()

if(NOT MODE MATCHES "^(add_subdirectory|fetchcontent|find_package)$")
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
set(_find -DTBVERBS_SOURCE_DIR=${TBVERBS_SOURCE_DIR})
if(MODE STREQUAL "find_package")
  # Only the scratch prefix: never a tbverbs installed on the machine or in the package registry.
  set(_find -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_DIR}/${MODE} -B ${WORK_DIR} ${_common}
    -DCMAKE_CXX_STANDARD=${CXX_STANDARD} -DCMAKE_CXX_STANDARD_REQUIRED=ON -DCMAKE_CXX_EXTENSIONS=OFF
    ${_find} -DTBVERBS_CONSUMER_COLLECTIVE=${COLLECTIVE})
run(${CMAKE_COMMAND} --build ${WORK_DIR} --verbose)
if(COLLECTIVE)
  run(${WORK_DIR}/tbverbs_collective_consumer)
  if(NOT run_output MATCHES "tbverbs collective consumer: .*no rank.*rank")
    message(FATAL_ERROR "unexpected collective consumer output")
  endif()
endif()
run(${WORK_DIR}/tbverbs_consumer)
if(NOT run_output MATCHES "${_expected_output}")
  message(FATAL_ERROR "unexpected consumer output (wanted '${_expected_output}')")
endif()
# The consumer's own standard wins: tbverbs asks only for a C++20 floor.
if(CXX_STANDARD STREQUAL "23" AND NOT run_output MATCHES "C\\+\\+ (202[1-9]|20[3-9][0-9])")
  message(FATAL_ERROR "the consumer asked for C++23 but was built with an older standard")
endif()
if(CXX_STANDARD STREQUAL "20" AND NOT run_output MATCHES "C\\+\\+ 202002")
  message(FATAL_ERROR "the consumer asked for C++20 but was built with another standard")
endif()
message("OK: ${MODE} consumer in C++${CXX_STANDARD}")
