# Issue 8, finding 14: the core headers stay quick to compile. Runs the compiler's include trace
# (-H) on HEADER and fails when it reaches one of FORBIDDEN, the headers that made it slow: for the
# data path the catalogue, the loader, GID tables, <thread>, <random>, <deque>, <mutex>,
# <algorithm>, <chrono>'s formatting via <sstream>, and <memory> and <atomic> (detail/ref.hpp and
# detail/atomic.hpp replace them); for the umbrella the same standard headers and <charconv>
# (detail/decimal.hpp). Deterministic, unlike a timing.
# Usage: cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DHEADER=tbverbs/data_path.hpp
#              "-DFORBIDDEN=tbverbs/loader.hpp;/deque;..." -P lean_includes.cmake
# (an entry starting with "/" is a standard header's last path component).
# The one-line source in the working directory (the test's build directory).
string(MAKE_C_IDENTIFIER "${HEADER}" id)
set(src ${CMAKE_CURRENT_BINARY_DIR}/lean_includes_${id}.cpp)
file(WRITE ${src} "#include <${HEADER}>\n")
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only -H -I${INCLUDE} ${src}
  RESULT_VARIABLE rc ERROR_VARIABLE trace OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${HEADER} does not compile on its own:\n${trace}")
endif()
set(bad "")
foreach(h IN LISTS FORBIDDEN)
  if(h MATCHES "^/")
    set(h "${h}\n")  # a standard header: its name ends the trace line
  endif()
  string(FIND "${trace}\n" "${h}" at)
  if(NOT at EQUAL -1)
    string(REPLACE "\n" "" h "${h}")
    list(APPEND bad "${h}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "${HEADER} pulls in: ${bad}")
endif()
message(STATUS "${HEADER} includes none of: ${FORBIDDEN}")
