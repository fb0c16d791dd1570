# Checks the generated API reference (run after the docs_build test; issue 13):
#   - Getting started is the first guide in the navigation tree, right after the main page;
#   - the README's License link points at LICENSE, which is copied next to index.html;
#   - the class list has no internals (tbverbs::detail, the bundled expected, the ABI namespace);
#   - every main class page shows an example taken from examples/tour/tour.cpp.
# Input: HTML_DIR.
set(_failed "")
file(READ "${HTML_DIR}/navtreedata.js" _nav)
# Page entries ("title", "page.html"), without the brackets (a CMake list keeps "[" unsplit).
string(REGEX MATCHALL "\"[^\"]*\", \"[a-z_0-9]+\\.html\"" _pages "${_nav}")
list(GET _pages 1 _first_guide)
if(NOT _first_guide MATCHES "\"Getting started\", \"getting_started.html\"")
  list(APPEND _failed "the first guide is ${_first_guide}, not Getting started")
endif()

file(READ "${HTML_DIR}/index.html" _index)
if(NOT _index MATCHES "<a href=\"LICENSE\">LICENSE</a>")
  list(APPEND _failed "index.html has no link to LICENSE")
endif()
if(NOT EXISTS "${HTML_DIR}/LICENSE")
  list(APPEND _failed "LICENSE is not next to index.html (the link would be broken)")
endif()

file(READ "${HTML_DIR}/annotated_dup.js" _classes)
foreach(_internal IN ITEMS "\"detail\"" "\"expected\"" "\"expected< void, E >\"" "\"unexpected\""
                           "\"bad_expected_access\"" "TBVERBS_ABI_NAMESPACE")
  string(FIND "${_classes}" "${_internal}" _at)
  if(NOT _at EQUAL -1)
    list(APPEND _failed "the class list shows ${_internal}")
  endif()
endforeach()

foreach(_page IN ITEMS classtbverbs_1_1Library classtbverbs_1_1Context classtbverbs_1_1GidTable
                       classtbverbs_1_1GidSelection classtbverbs_1_1ProtectionDomain
                       classtbverbs_1_1AlignedBuffer classtbverbs_1_1MemoryRegion
                       classtbverbs_1_1CompletionQueue classtbverbs_1_1QpRecipe
                       classtbverbs_1_1PreparedQueuePair classtbverbs_1_1QueuePair
                       classtbverbs_1_1SideChannel structtbverbs_1_1Endpoint structtbverbs_1_1Error)
  file(READ "${HTML_DIR}/${_page}.html" _html)
  string(FIND "${_html}" "Example, from the README's tour" _at)
  if(_at EQUAL -1 OR NOT _html MATCHES "class=\"fragment\"")
    list(APPEND _failed "${_page}.html has no example from the tour")
  endif()
endforeach()

if(_failed)
  list(JOIN _failed "\n  " _failed)
  message(FATAL_ERROR "the API reference:\n  ${_failed}")
endif()
message(STATUS "the API reference: Getting started first, License linked, no internals in the class list, an example on every main class page")
