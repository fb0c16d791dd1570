# cmake -DCXX=<compiler> -DINCLUDE_DIR=<tbverbs include> -DTEST_DIR=<tests/abi> -P compile_with.cmake
# Compiles every ABI test source with CXX at -std=c++20 -Wall -Wextra -Wpedantic -Werror
# (-fsyntax-only: static_asserts and -Wswitch run, nothing is linked), abi_select.cpp in both
# abi.hpp modes. Fails on the first diagnostic.
foreach(_var CXX INCLUDE_DIR TEST_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "compile_with.cmake: -D${_var}=... is required")
  endif()
endforeach()

set(_flags -std=c++20 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I${INCLUDE_DIR} -I${TEST_DIR})
set(_units
    "abi_compare.cpp"
    "abi_layout.cpp"
    "abi_dispatch.cpp"
    "abi_select.cpp"
    "abi_select.cpp\;-DTBVERBS_USE_OWN_ABI")
foreach(_unit IN LISTS _units)
  set(_args ${_unit})
  list(POP_FRONT _args _source)
  execute_process(COMMAND ${CXX} ${_flags} ${_args} ${TEST_DIR}/${_source}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "FAIL ${CXX} ${_source} ${_args}:\n${_out}")
  endif()
  message(STATUS "ok   ${CXX} ${_source} ${_args}")
endforeach()
