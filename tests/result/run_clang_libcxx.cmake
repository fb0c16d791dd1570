# Builds and runs result_backends.cpp with clang++-19, -std=c++23 and libc++, requiring the
# std::expected backend (RESULT_TEST_REQUIRE_STD=1). Inputs: CLANGXX, SOURCE, INCLUDE_DIR,
# WORK_DIR; optional NAME (the program's name, default result_backends) and DEFINES (default
# -DRESULT_TEST_REQUIRE_STD=1), so other self-checking programs run the same way
# (tests/printing/format_check.cpp).
#
# Missing clang-19 or a libc++ with the monadic std::expected is reported as skipped, never as a
# pass: the script prints the skip marker matched by the test's SKIP_REGULAR_EXPRESSION, and
# exits 77 (SKIP_RETURN_CODE) where CMake can (3.29+). Anything else that goes wrong fails.
cmake_minimum_required(VERSION 3.20)

function(skip reason)
  message(STATUS "TBVERBS_RESULT_TEST_SKIPPED: ${reason}")
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.29)
    cmake_language(EXIT 77)
  endif()
  # Older CMake cannot choose its exit code; the marker above makes ctest report a skip.
endfunction()

macro(run_or_skip)
  skip(${ARGN})
  return()
endmacro()

if(NOT CLANGXX OR NOT EXISTS "${CLANGXX}")
  run_or_skip("clang++-19 not found (install clang-19 and libc++-19-dev)")
endif()
file(MAKE_DIRECTORY "${WORK_DIR}")
if(NOT DEFINED NAME)
  set(NAME result_backends)
endif()
if(NOT DEFINED DEFINES)
  set(DEFINES -DRESULT_TEST_REQUIRE_STD=1)
endif()

# libc++'s directory, so the programs run without LD_LIBRARY_PATH wherever libc++ lives.
set(_rpath "")
execute_process(COMMAND "${CLANGXX}" -stdlib=libc++ -print-file-name=libc++.so
  OUTPUT_VARIABLE _libcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(IS_ABSOLUTE "${_libcxx}" AND EXISTS "${_libcxx}")
  get_filename_component(_libdir "${_libcxx}" DIRECTORY)
  set(_rpath "-Wl,-rpath,${_libdir}")
endif()

# Probe: is there a libc++ whose std::expected has the C++23 monadic members?
file(WRITE "${WORK_DIR}/probe.cpp" [=[
#include <version>
#if !defined(_LIBCPP_VERSION)
#error "not libc++"
#endif
#if !defined(__cpp_lib_expected) || __cpp_lib_expected < 202211L
#error "libc++ lacks the monadic std::expected"
#endif
#include <expected>
int main() {
  std::expected<int, int> e = 1;
  return e.and_then([](int v) -> std::expected<int, int> { return v - 1; }).value();
}
]=])
execute_process(
  COMMAND "${CLANGXX}" -std=c++23 -stdlib=libc++ ${_rpath} "${WORK_DIR}/probe.cpp" -o "${WORK_DIR}/probe"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  string(SUBSTRING "${_out}" 0 400 _out)
  run_or_skip("${CLANGXX} has no usable libc++ with monadic std::expected: ${_out}")
endif()
execute_process(COMMAND "${WORK_DIR}/probe" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  run_or_skip("a libc++ program does not run here (rc ${_rc}): ${_out}")
endif()

# The test itself: from here on every problem is a failure.
execute_process(
  COMMAND "${CLANGXX}" -std=c++23 -stdlib=libc++ -Wall -Wextra -Wpedantic -Werror
          ${DEFINES} -I "${INCLUDE_DIR}" ${_rpath}
          "${SOURCE}" -o "${WORK_DIR}/${NAME}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} with ${CLANGXX} -std=c++23 -stdlib=libc++ failed:\n${_out}")
endif()
execute_process(COMMAND "${WORK_DIR}/${NAME}"
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
message(STATUS "${_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NAME} (clang-19, libc++) failed with exit code ${_rc}")
endif()
