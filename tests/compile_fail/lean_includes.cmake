# Issue 8, finding 14: the data-path header stays lean. Runs the compiler's include trace (-H) on
# tbverbs/data_path.hpp and fails when it reaches a header that made the data path slow to compile
# (the catalogue, the loader, GID tables, <thread>, <random>, <deque>, <mutex>, <algorithm>,
# <chrono>'s formatting via <sstream>, or <memory> and <atomic>, which detail/ref.hpp and
# detail/atomic.hpp replace). Deterministic, unlike a timing.
# Usage: cmake -DCXX=<compiler> -DINCLUDE=<include dir> -P lean_includes.cmake
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only -H -I${INCLUDE} -x c++ -
  INPUT_FILE ${CMAKE_CURRENT_LIST_DIR}/lean_includes.cpp
  RESULT_VARIABLE rc ERROR_VARIABLE trace OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "data_path.hpp does not compile on its own:\n${trace}")
endif()
set(bad "")
foreach(h IN ITEMS "tbverbs/diagnosis.hpp" "tbverbs/loader.hpp" "tbverbs/gid.hpp" "tbverbs/recipe.hpp"
                   "tbverbs/context.hpp" "/thread\n" "/random\n" "/deque\n" "/mutex\n" "/algorithm\n" "/sstream\n"
                   "/memory\n" "/atomic\n")
  string(FIND "${trace}\n" "${h}" at)
  if(NOT at EQUAL -1)
    string(REPLACE "\n" "" h "${h}")
    list(APPEND bad "${h}")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "tbverbs/data_path.hpp pulls in: ${bad}")
endif()
message(STATUS "data_path.hpp includes none of the heavy headers")
