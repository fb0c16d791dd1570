# Runs one compile check (see TbverbsCompileChecks.cmake): cmake -DPARAMS=<file> -P <this file>.
if(NOT DEFINED PARAMS OR NOT EXISTS "${PARAMS}")
  message(FATAL_ERROR "compile check: PARAMS=<parameter file> is required")
endif()
include(${PARAMS})

# Plain ASCII quotes and English messages, whatever the caller's locale, so regexes stay simple.
set(ENV{LC_ALL} C)
set(ENV{LANG} C)

execute_process(
  COMMAND ${TBVERBS_CC_COMPILER} ${TBVERBS_CC_ARGS}
  RESULT_VARIABLE rc
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)

list(JOIN TBVERBS_CC_ARGS " " _args)
message("command: ${TBVERBS_CC_COMPILER} ${_args}")
message("exit: ${rc}")
if(NOT out STREQUAL "")
  message("compiler output:\n${out}")
endif()

if(TBVERBS_CC_EXPECT STREQUAL "PASS")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected the source to compile, but the compiler failed")
  endif()
  message("OK: compiled as expected")
else()
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a compile error, but the source compiled: the misuse is not rejected")
  endif()
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "the compiler did not run: ${rc}")
  endif()
  if(NOT out MATCHES "${TBVERBS_CC_REGEX}")
    message(FATAL_ERROR "compilation failed, but not with the expected diagnostic:\n  ${TBVERBS_CC_REGEX}")
  endif()
  message("OK: rejected with the expected diagnostic")
endif()
