# The layering of the coordinator's and the worker's libraries, checked when the build is
# configured.
#
# Every library of coordinator/ and worker/ is declared a layer: its folder (or, for a library
# that owns a few files of a folder, those files) and the layers it may include, which are its
# direct link dependencies. stagecoach_check_layering() then reads every .h/.cc of every layer
# and fails the configuration when
#   - a file includes a header of another layer that its own layer does not link directly
#     ("coordinator/planning/planner.cc includes coordinator/service/...: stagecoach_..._planning
#     does not link stagecoach_coordinator_service"), or
#   - the layers' dependencies form a cycle.
# So a header moved, or an include added across folders, either follows the one-way order that
# docs/architecture.md draws or stops the build with the file, the line's header and the missing
# edge. Headers outside registered layers (common/, proto, third-party) are not checked.
#
# The checking part (stagecoach_layering_violations) works on global properties alone, so that
# tests/cmake/layering_test.cmake runs it in script mode (cmake -P) on a tree of its own.

# Declares `name` a layer: the files under each of DIRS (relative to ROOT, not recursing into
# sub-folders that are layers themselves) or exactly FILES, depending on DEPS (other layers'
# names). Script mode passes DEPS; stagecoach_layer_target takes them from a target.
function(stagecoach_layer name)
  cmake_parse_arguments(L "" "ROOT" "DIRS;FILES;DEPS" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_LAYERS ${name})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_ROOT ${L_ROOT})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_DIRS ${L_DIRS})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_FILES ${L_FILES})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_DEPS ${L_DEPS})
endfunction()

# Declares the library `target` a layer (DIRS/FILES relative to the project's source root); its
# dependencies are read from its LINK_LIBRARIES at check time, when every target exists.
function(stagecoach_layer_target target)
  stagecoach_layer(${target} ROOT ${PROJECT_SOURCE_DIR} ${ARGN})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_LAYER_TARGETS ${target})
endfunction()

# The layer that owns the project-relative `path` (a header named by an #include, or a file of
# a layer), or "" when none does. FILES win over DIRS; a deeper DIR wins over a shallower one.
function(_stagecoach_layer_of path out)
  get_property(layers GLOBAL PROPERTY STAGECOACH_LAYERS)
  set(best "")
  set(best_len -1)
  get_filename_component(dir ${path} DIRECTORY)
  foreach(layer ${layers})
    get_property(files GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_FILES)
    if(path IN_LIST files)
      set(${out} ${layer} PARENT_SCOPE)
      return()
    endif()
    get_property(dirs GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DIRS)
    foreach(d ${dirs})
      string(LENGTH "${d}" len)
      if(dir STREQUAL d AND len GREATER best_len)
        set(best ${layer})
        set(best_len ${len})
      endif()
    endforeach()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

# The project-relative .h/.cc files of `layer`.
function(_stagecoach_layer_files layer out)
  get_property(root GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_ROOT)
  get_property(dirs GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DIRS)
  get_property(files GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_FILES)
  set(result "")
  foreach(d ${dirs})
    file(GLOB found RELATIVE ${root} ${root}/${d}/*.h ${root}/${d}/*.cc)
    foreach(f ${found})
      # A file another layer claims by name (a small library inside a folder) is not this one's.
      _stagecoach_layer_of(${f} owner)
      if(owner STREQUAL layer)
        list(APPEND result ${f})
      endif()
    endforeach()
  endforeach()
  list(APPEND result ${files})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Appends to `out` one message per include that crosses to a layer not among the includer's
# dependencies, and one per dependency cycle.
function(stagecoach_layering_violations out)
  get_property(layers GLOBAL PROPERTY STAGECOACH_LAYERS)
  set(problems "")
  foreach(layer ${layers})
    get_property(root GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_ROOT)
    get_property(deps GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DEPS)
    _stagecoach_layer_files(${layer} files)
    foreach(f ${files})
      file(STRINGS ${root}/${f} includes REGEX "^#include \"[^\"]+\"")
      foreach(line ${includes})
        string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
        _stagecoach_layer_of(${header} owner)
        if(owner STREQUAL "" OR owner STREQUAL layer OR owner IN_LIST deps)
          continue()
        endif()
        list(APPEND problems
             "${f} includes ${header}: ${layer} does not link ${owner} (add the dependency, if it points down the layers, or move the code)")
      endforeach()
    endforeach()
  endforeach()
  # Cycles: a depth-first walk from every layer that meets itself again.
  foreach(start ${layers})
    set(stack "")
    get_property(frontier GLOBAL PROPERTY STAGECOACH_LAYER_${start}_DEPS)
    set(seen "")
    while(frontier)
      list(POP_FRONT frontier next)
      if(next STREQUAL start)
        list(APPEND problems "${start} depends on itself through its dependencies (a cycle)")
        break()
      endif()
      if(next IN_LIST seen)
        continue()
      endif()
      list(APPEND seen ${next})
      get_property(more GLOBAL PROPERTY STAGECOACH_LAYER_${next}_DEPS)
      list(APPEND frontier ${more})
    endwhile()
  endforeach()
  set(${out} ${problems} PARENT_SCOPE)
endfunction()

# Fills in the dependencies of the target layers from their LINK_LIBRARIES (those that are
# layers themselves) and fails the configuration on any violation.
function(stagecoach_check_layering)
  get_property(targets GLOBAL PROPERTY STAGECOACH_LAYER_TARGETS)
  foreach(t ${targets})
    get_target_property(links ${t} LINK_LIBRARIES)
    set(deps "")
    foreach(l ${links})
      if(l IN_LIST targets)
        list(APPEND deps ${l})
      endif()
    endforeach()
    set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${t}_DEPS ${deps})
  endforeach()
  stagecoach_layering_violations(problems)
  if(problems)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "Layering (cmake/layering.cmake, docs/architecture.md):\n  ${text}")
  endif()
endfunction()
