# Included by the consumer projects after tbverbs is available: with TBVERBS_CONSUMER_COLLECTIVE
# (the consumer test sets it for one standard only, as it compiles the whole layer), a program on
# the collectives layer compiled once (README: "Compile once"; tbverbs_add_collective_library).
option(TBVERBS_CONSUMER_COLLECTIVE "Also build a program on tbverbs_add_collective_library" OFF)
if(TBVERBS_CONSUMER_COLLECTIVE)
  tbverbs_add_collective_library(consumer_collectives)
  add_executable(tbverbs_collective_consumer ${CMAKE_CURRENT_LIST_DIR}/collective_main.cpp)
  target_link_libraries(tbverbs_collective_consumer PRIVATE consumer_collectives)
  target_compile_options(tbverbs_collective_consumer PRIVATE -Wall -Wextra -Wpedantic -Werror)
endif()
