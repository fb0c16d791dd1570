# Issue 8, finding 14: the core headers stay quick to compile. Runs the compiler's include trace
# (-H) on HEADER and fails when it reaches one of FORBIDDEN, the headers that made it slow: for the
# data path the catalogue, the loader, GID tables, <thread>, <random>, <deque>, <mutex>,
# <algorithm>, <chrono>'s formatting via <sstream>, and <memory> and <atomic> (detail/ref.hpp and
# detail/atomic.hpp replace them); for the umbrella the same standard headers and <charconv>
# (detail/decimal.hpp). Deterministic, unlike a timing.
# Usage: cmake -DCXX=<compiler> -DINCLUDE=<include dir> -DHEADER=tbverbs/data_path.hpp
#              "-DFORBIDDEN=tbverbs/loader.hpp;/deque;..." [-DFLAGS=-stdlib=libc++] -P lean_includes.cmake
# (an entry starting with "/" is a standard header's name, counted where one of our headers
# includes it directly).
cmake_minimum_required(VERSION 3.20)  # IN_LIST in script mode
# The one-line source in the working directory (the test's build directory).
string(MAKE_C_IDENTIFIER "${HEADER}" id)
set(src ${CMAKE_CURRENT_BINARY_DIR}/lean_includes_${id}.cpp)
file(WRITE ${src} "#include <${HEADER}>\n")
execute_process(
  COMMAND ${CXX} -std=c++20 ${FLAGS} -fsyntax-only -H -I${INCLUDE} ${src}
  RESULT_VARIABLE rc ERROR_VARIABLE trace OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${HEADER} does not compile on its own:\n${trace}")
endif()
# Our headers (FORBIDDEN entries with a "/" inside) anywhere in the trace; a standard header only
# where one of our headers includes it directly: what the standard library includes inside
# itself is not ours to choose (libc++ reaches <atomic> and <memory> from <string>).
set(bad "")
set(std_names "")
foreach(h IN LISTS FORBIDDEN)
  if(h MATCHES "^/")
    string(SUBSTRING "${h}" 1 -1 name)
    list(APPEND std_names "${name}")
  else()
    string(FIND "${trace}" "${h}" at)
    if(NOT at EQUAL -1)
      list(APPEND bad "${h}")
    endif()
  endif()
endforeach()
string(REPLACE ";" "," trace_lines "${trace}")
string(REPLACE "\n" ";" trace_lines "${trace_lines}")
set(stack "")  # the path at each depth of the trace so far
foreach(line IN LISTS trace_lines)
  if(NOT line MATCHES "^(\\.+) (.+)$")
    continue()
  endif()
  string(LENGTH "${CMAKE_MATCH_1}" depth)
  set(path "${CMAKE_MATCH_2}")
  math(EXPR keep "${depth} - 1")
  list(LENGTH stack n)
  while(n GREATER keep)
    list(REMOVE_AT stack -1)
    list(LENGTH stack n)
  endwhile()
  set(parent "")
  if(n GREATER 0)
    list(GET stack -1 parent)
  endif()
  list(APPEND stack "${path}")
  if(parent MATCHES "/tbverbs/")
    get_filename_component(name "${path}" NAME)
    if(name IN_LIST std_names)
      list(APPEND bad "/${name} (from ${parent})")
    endif()
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "${HEADER} pulls in: ${bad}")
endif()
message(STATUS "${HEADER} includes none of: ${FORBIDDEN}")
