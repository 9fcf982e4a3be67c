# cmake -P tests/cmake/layering_test.cmake: the layering check of cmake/layering.cmake on a tree
# of its own (in WORK, default a folder under the build's temp space), with one include across
# layers that is allowed, one that is not, a file another layer owns by name inside a folder,
# and a cycle. Fails (FATAL_ERROR) when the check misses a violation or reports a legal include.
cmake_minimum_required(VERSION 3.22)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/layering.cmake)

if(NOT WORK)
  set(WORK ${CMAKE_CURRENT_BINARY_DIR}/layering_test_tree)
endif()
file(REMOVE_RECURSE ${WORK})

# low <- mid <- top; `gate` is one file inside mid's folder, its own layer with no dependencies.
file(WRITE ${WORK}/app/low/low.h "#pragma once\n#include <vector>\n#include \"common/util.h\"\n")
file(WRITE ${WORK}/app/mid/mid.h "#pragma once\n#include \"app/low/low.h\"\n")
file(WRITE ${WORK}/app/mid/gate.h "#pragma once\n")
file(WRITE ${WORK}/app/mid/gate.cc "#include \"app/mid/gate.h\"\n#include \"app/mid/mid.h\"\n")
file(WRITE ${WORK}/app/top/top.cc "#include \"app/mid/mid.h\"\n#include \"app/mid/gate.h\"\n")
# The violation: the lowest layer reaches up.
file(WRITE ${WORK}/app/low/low.cc "#include \"app/low/low.h\"\n#include \"app/top/top.h\"\n")
file(WRITE ${WORK}/app/top/top.h "#pragma once\n")

stagecoach_layer(low ROOT ${WORK} DIRS app/low)
stagecoach_layer(mid ROOT ${WORK} DIRS app/mid DEPS low gate)
stagecoach_layer(gate ROOT ${WORK} FILES app/mid/gate.h app/mid/gate.cc)
stagecoach_layer(top ROOT ${WORK} DIRS app/top DEPS mid gate)

function(expect_problems expected)
  stagecoach_layering_violations(problems)
  list(LENGTH problems n)
  if(NOT n EQUAL expected)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "expected ${expected} problem(s), got ${n}:\n  ${text}")
  endif()
  set(problems ${problems} PARENT_SCOPE)
endfunction()

# low.cc -> top and gate.cc -> mid (gate does not link mid): two crossings, no cycle.
expect_problems(2)
list(GET problems 0 first)
list(GET problems 1 second)
if(NOT first MATCHES "^app/low/low.cc includes app/top/top.h: low does not link top")
  message(FATAL_ERROR "unexpected message: ${first}")
endif()
if(NOT second MATCHES "^app/mid/gate.cc includes app/mid/mid.h: gate does not link mid")
  message(FATAL_ERROR "unexpected message: ${second}")
endif()

# Linking what they include clears the crossings, but low -> top -> mid -> low is a cycle.
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_low_DEPS top)
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_gate_DEPS mid)
stagecoach_layering_violations(problems)
list(FILTER problems INCLUDE REGEX "cycle")
list(LENGTH problems cycles)
if(cycles LESS 1)
  message(FATAL_ERROR "the cycle low -> top -> mid -> low was not reported")
endif()

# The legal tree: no problems at all.
file(WRITE ${WORK}/app/low/low.cc "#include \"app/low/low.h\"\n")
file(WRITE ${WORK}/app/mid/gate.cc "#include \"app/mid/gate.h\"\n")
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_low_DEPS "")
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_gate_DEPS "")
expect_problems(0)
file(REMOVE_RECURSE ${WORK})
message(STATUS "layering check: crossings, a layer inside a folder and cycles reported")
