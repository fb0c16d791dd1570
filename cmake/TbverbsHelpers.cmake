# Helper functions for tbverbs' own targets (tests, examples, benchmarks, emulator).
# Nothing here is applied to the tbverbs INTERFACE target or to consumers.
include_guard(GLOBAL)

# tbverbs_target_warnings(<target>...)
#   Strict warnings as errors on tbverbs' own test/example/bench targets.
function(tbverbs_target_warnings)
  foreach(target IN LISTS ARGN)
    if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
      target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror)
      # GCC 12 at -O3 reports -Wrestrict inside libstdc++'s own std::string code (GCC bug
      # 105329); keep it visible as a warning rather than fail Release builds on it.
      if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
        target_compile_options(${target} PRIVATE -Wno-error=restrict)
      endif()
    elseif(MSVC)
      target_compile_options(${target} PRIVATE /W4 /WX /permissive-)
    endif()
  endforeach()
endfunction()

# Source directories already added anywhere in the build (walks SUBDIRECTORIES from the top).
function(_tbverbs_added_source_dirs out dir)
  get_property(_subs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  set(_all ${_subs})
  foreach(_sub IN LISTS _subs)
    _tbverbs_added_source_dirs(_nested ${_sub})
    list(APPEND _all ${_nested})
  endforeach()
  set(${out} ${_all} PARENT_SCOPE)
endfunction()

# tbverbs_add_all_subdirectories()
#   add_subdirectory() of every direct subfolder of the current source directory that has a
#   CMakeLists.txt, in sorted order, so a new example or benchmark needs no edit of its parent.
#   CONFIGURE_DEPENDS re-runs the glob when a folder appears. A folder that another part of the
#   build already added (e.g. bench/p2p from emulator/) is skipped instead of added twice.
function(tbverbs_add_all_subdirectories)
  file(GLOB _tbverbs_lists CONFIGURE_DEPENDS LIST_DIRECTORIES false
       RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*/CMakeLists.txt)
  list(SORT _tbverbs_lists)
  _tbverbs_added_source_dirs(_added ${CMAKE_SOURCE_DIR})
  foreach(_list IN LISTS _tbverbs_lists)
    get_filename_component(_dir ${_list} DIRECTORY)
    if(NOT ${CMAKE_CURRENT_SOURCE_DIR}/${_dir} IN_LIST _added)
      add_subdirectory(${_dir})
    endif()
  endforeach()
endfunction()

# TBVERBS_SANITIZER_PRELOAD: in a sanitized build (the asan preset), the sanitizer runtimes to put
# in LD_PRELOAD when a test runs a program that is NOT instrumented (ibv_devinfo, ibv_*_pingpong)
# on an instrumented library (the emulator): ASan must come first in the library list, otherwise
# the program stops with "ASan runtime does not come first in initial library list". Empty in an
# unsanitized build. Use: set_tests_properties(t PROPERTIES ENVIRONMENT "LD_PRELOAD=${TBVERBS_SANITIZER_PRELOAD}")
set(TBVERBS_SANITIZER_PRELOAD "")
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*address")
  set(_tbverbs_runtimes libasan.so)
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND _tbverbs_runtimes libubsan.so)
  endif()
  foreach(_rt IN LISTS _tbverbs_runtimes)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_rt}
                    OUTPUT_VARIABLE _path OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(IS_ABSOLUTE "${_path}" AND EXISTS "${_path}")
      get_filename_component(_path "${_path}" REALPATH)
      list(APPEND TBVERBS_SANITIZER_PRELOAD "${_path}")
    endif()
  endforeach()
  string(REPLACE ";" ":" TBVERBS_SANITIZER_PRELOAD "${TBVERBS_SANITIZER_PRELOAD}")
endif()

# Every contested reading of Apple's driver that the emulator plays, as NAME=VALUE (the table with
# sources is emulator/src/quirks.cpp and docs/emulator.md). The examples, the tools and the ring
# are tested under each value; keep this list in step with that table.
set(TBVERBS_EMU_QUIRK_VALUES
    empty_rq=wait empty_rq=drop empty_rq=kill
    macos=26.3 macos=26.2
    mr_access=any mr_access=local_write_only mr_access=remote_required
    completion_channels=off completion_channels=on
    post_limit=granted post_limit=63)

# The environment an UNinstrumented program (a Debian tool, a program built by a plain `c++`)
# needs to load this build's emulator: in an AddressSanitizer build, the sanitizer runtimes
# preloaded (they must come first) and leak checking off (the program's leaks are not ours).
# Empty otherwise. Sets `out` to the list of NAME=VALUE entries. `tsan_out` is set to TRUE in a
# ThreadSanitizer build: TSan cannot be preloaded, so such programs cannot load the emulator.
function(tbverbs_uninstrumented_env out tsan_out)
  set(_env "")
  if("${CMAKE_CXX_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS}" MATCHES "-fsanitize=[^ ]*address")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set(_libs libasan.so)
      if("${CMAKE_CXX_FLAGS}" MATCHES "-fsanitize=[^ ]*undefined")
        list(APPEND _libs libubsan.so)
      endif()
    else()
      set(_libs libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)
    endif()
    set(_preload "")
    foreach(_lib IN LISTS _libs)
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_lib}
                      OUTPUT_VARIABLE _path OUTPUT_STRIP_TRAILING_WHITESPACE)
      list(APPEND _preload ${_path})
    endforeach()
    list(JOIN _preload ":" _preload)
    set(_env "LD_PRELOAD=${_preload}" "ASAN_OPTIONS=detect_leaks=0")
  endif()
  set(${out} "${_env}" PARENT_SCOPE)
  if(CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*thread")
    set(${tsan_out} TRUE PARENT_SCOPE)
  else()
    set(${tsan_out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# tbverbs_find_cli11()
#   The one lookup of CLI11 for the emulator's CLI, the examples, the tools and the benchmarks:
#   defines the INTERFACE target tbverbs_cli11 when CLI11's CMake package or its header alone
#   (/usr/include/CLI/CLI.hpp; CLI11 is header-only) is found; callers test TARGET tbverbs_cli11
#   and link it. The package's include directories are copied rather than its imported target
#   linked, because an imported target is visible only in the directory that found it.
function(tbverbs_find_cli11)
  if(TARGET tbverbs_cli11)
    return()
  endif()
  find_package(CLI11 QUIET)
  if(TARGET CLI11::CLI11)
    add_library(tbverbs_cli11 INTERFACE)
    get_target_property(_inc CLI11::CLI11 INTERFACE_INCLUDE_DIRECTORIES)
    if(_inc)
      target_include_directories(tbverbs_cli11 SYSTEM INTERFACE ${_inc})
    endif()
  elseif(EXISTS /usr/include/CLI/CLI.hpp)
    add_library(tbverbs_cli11 INTERFACE)
  endif()
endfunction()
