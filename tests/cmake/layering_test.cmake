# cmake -P tests/cmake/layering_test.cmake: the layering check of cmake/layering.cmake on a tree
# of its own (in WORK, default a folder under the build's temp space). Each case is a tree with
# exactly the problems it names, and the check must report exactly those: an include across
# layers that is not linked (in every spelling: quotes, angle brackets, indented, relative), one
# in a sub-folder of a layer's folder, a file that belongs to no layer, a library that owns a few
# files of another's folder (its files are checked against its own links, not the folder's), a
# cycle, and the legal tree. Fails (FATAL_ERROR) on any difference.
cmake_minimum_required(VERSION 3.22)
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/layering.cmake)

if(NOT WORK)
  set(WORK ${CMAKE_CURRENT_BINARY_DIR}/layering_test_tree)
endif()

# The legal tree: low <- mid <- top; `gate` is two files inside mid's folder, a layer of its own
# that links `side` (which mid does not); mid/detail/ is mid's too.
function(write_legal_tree)
  file(REMOVE_RECURSE ${WORK})
  file(WRITE ${WORK}/app/low/low.h "#pragma once\n#include <vector>\n#include \"common/util.h\"\n")
  file(WRITE ${WORK}/app/low/low.cc "#include \"app/low/low.h\"\n")
  file(WRITE ${WORK}/app/side/side.h "#pragma once\n")
  file(WRITE ${WORK}/app/mid/mid.h "#pragma once\n#include \"app/low/low.h\"\n")
  file(WRITE ${WORK}/app/mid/detail/helper.h "#pragma once\n#include \"app/mid/mid.h\"\n")
  file(WRITE ${WORK}/app/mid/gate.h "#pragma once\n#include \"app/side/side.h\"\n")
  file(WRITE ${WORK}/app/mid/gate.cc "#include \"app/mid/gate.h\"\n")
  file(WRITE ${WORK}/app/top/top.h "#pragma once\n")
  file(WRITE ${WORK}/app/top/top.cc
       "#include \"app/mid/mid.h\"\n#include \"app/mid/gate.h\"\n#include \"../mid/detail/helper.h\"\n")
  file(WRITE ${WORK}/app/main.cc "#include \"app/top/top.h\"\n")
endfunction()

set_property(GLOBAL PROPERTY STAGECOACH_LAYERS "")
stagecoach_layering_roots(ROOT ${WORK} DIRS app)
stagecoach_layer(low ROOT ${WORK} DIRS app/low)
stagecoach_layer(side ROOT ${WORK} DIRS app/side)
stagecoach_layer(mid ROOT ${WORK} DIRS app/mid DEPS low)
stagecoach_layer(gate ROOT ${WORK} FILES app/mid/gate.h app/mid/gate.cc DEPS side)
stagecoach_layer(top ROOT ${WORK} DIRS app/top DEPS mid gate)
stagecoach_layer(main ROOT ${WORK} FILES app/main.cc DEPS top)

# Runs the check and compares its messages, in order, with the regular expressions given.
function(expect_problems)
  stagecoach_layering_violations(problems)
  list(LENGTH problems got)
  list(LENGTH ARGN want)
  list(JOIN problems "\n  " text)
  if(NOT got EQUAL want)
    message(FATAL_ERROR "expected ${want} problem(s), got ${got}:\n  ${text}")
  endif()
  foreach(i RANGE 1 ${want})
    if(i GREATER want)
      break()
    endif()
    math(EXPR k "${i} - 1")
    list(GET problems ${k} p)
    list(GET ARGN ${k} re)
    if(NOT p MATCHES "${re}")
      message(FATAL_ERROR "problem ${i} is\n  ${p}\nexpected to match\n  ${re}\nall:\n  ${text}")
    endif()
  endforeach()
endfunction()

write_legal_tree()
expect_problems()

# The lowest layer reaching up, in each spelling of #include.
file(WRITE ${WORK}/app/low/low.cc
     "#include \"app/low/low.h\"\n#include <app/top/top.h>\n  #  include \"app/mid/mid.h\"\n#include \"../side/side.h\"\n")
expect_problems("^app/low/low.cc includes app/top/top.h: low does not link top"
                "^app/low/low.cc includes app/mid/mid.h: low does not link mid"
                "^app/low/low.cc includes app/side/side.h: low does not link side")

# A file in a sub-folder of a layer's folder is that layer's, and checked as such.
write_legal_tree()
file(WRITE ${WORK}/app/mid/detail/helper.h "#pragma once\n#include \"app/top/top.h\"\n")
expect_problems("^app/mid/detail/helper.h includes app/top/top.h: mid does not link top")

# A file that belongs to no layer: at the top of the root, and in a folder nobody declares.
write_legal_tree()
file(WRITE ${WORK}/app/stray.cc "\n")
file(WRITE ${WORK}/app/newroom/thing.h "#pragma once\n")
expect_problems("^app/newroom/thing.h belongs to no library" "^app/stray.cc belongs to no library")

# gate's files are checked against gate's links: gate.h including side is fine (mid's folder does
# not make it mid's), and mid itself may not include side.
write_legal_tree()
file(WRITE ${WORK}/app/mid/mid.h "#pragma once\n#include \"app/side/side.h\"\n")
expect_problems("^app/mid/mid.h includes app/side/side.h: mid does not link side")

# A cycle: low linking top (which reaches low through mid) is reported for each layer on it, not
# for main, which only reaches it.
write_legal_tree()
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_low_DEPS top)
expect_problems("^low depends on itself" "^mid depends on itself" "^top depends on itself")
set_property(GLOBAL PROPERTY STAGECOACH_LAYER_low_DEPS "")

write_legal_tree()
expect_problems()
file(REMOVE_RECURSE ${WORK})
message(STATUS "layering check: crossings in every spelling, sub-folders, files of no library, "
               "a library inside a folder and cycles reported; the legal tree passes")
