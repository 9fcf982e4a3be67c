# The layering of the coordinator's and the worker's libraries, checked when the build is
# configured and again by the build whenever one of their files changes.
#
# Every library of coordinator/ and worker/ is declared a layer: its folder (with the folders
# under it that no other layer claims) or, for a library that owns a few files of a folder,
# those files; the layers it may include are its direct link dependencies. The check reads
# every .h/.cc of the layers and of the roots they live in (coordinator/, worker/), and fails
# when
#   - a file includes a header of another layer that its own layer does not link directly
#     ("coordinator/planning/planner.cc includes coordinator/service/...: stagecoach_..._planning
#     does not link stagecoach_coordinator_service"), in any spelling of #include: quotes or
#     angle brackets, indented, or relative to the file ("../jobs/job.h");
#   - a file under a root belongs to no layer (a file left at the top of coordinator/, a new
#     folder no library declares);
#   - the layers' dependencies form a cycle.
# So a header moved, or an include added across folders, either follows the one-way order that
# docs/architecture.md draws or stops the build with the file, the header and the missing edge.
# Headers outside the roots (common/, proto, third-party) are not checked.
#
# The checking part (stagecoach_layering_violations) works on global properties alone: the
# configuration writes them to <build>/layering_registry.cmake, which the build's re-check
# (`cmake -P cmake/layering.cmake` with STAGECOACH_LAYERING_REGISTRY set) reads, and
# tests/cmake/layering_test.cmake runs it on a tree of its own.

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  cmake_minimum_required(VERSION 3.22)  # the policies the functions below are written for
endif()

# Declares `name` a layer: the files under each of DIRS (relative to ROOT; sub-folders too,
# unless another layer declares them) or exactly FILES, depending on DEPS (other layers'
# names). Script mode passes DEPS; stagecoach_layer_target takes them from a target.
function(stagecoach_layer name)
  cmake_parse_arguments(L "" "ROOT" "DIRS;FILES;DEPS" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_LAYERS ${name})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_ROOT ${L_ROOT})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_DIRS ${L_DIRS})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_FILES ${L_FILES})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${name}_DEPS ${L_DEPS})
endfunction()

# Declares folders (relative to ROOT) every file under which must belong to a layer.
function(stagecoach_layering_roots)
  cmake_parse_arguments(L "" "ROOT" "DIRS" ${ARGN})
  set_property(GLOBAL PROPERTY STAGECOACH_LAYERING_ROOT ${L_ROOT})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_LAYERING_ROOTS ${L_DIRS})
endfunction()

# Declares the library `target` a layer (DIRS/FILES relative to the project's source root); its
# dependencies are read from its LINK_LIBRARIES at check time, when every target exists.
function(stagecoach_layer_target target)
  stagecoach_layer(${target} ROOT ${PROJECT_SOURCE_DIR} ${ARGN})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_LAYER_TARGETS ${target})
endfunction()

# The layer that owns the root-relative `path` (a header named by an #include, or a file), or ""
# when none does: a layer that names the file, else the layer of its deepest declared folder.
function(_stagecoach_layer_of path out)
  get_property(layers GLOBAL PROPERTY STAGECOACH_LAYERS)
  set(best "")
  set(best_len -1)
  foreach(layer ${layers})
    get_property(files GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_FILES)
    if(path IN_LIST files)
      set(${out} ${layer} PARENT_SCOPE)
      return()
    endif()
    get_property(dirs GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DIRS)
    foreach(d ${dirs})
      string(LENGTH "${d}" len)
      string(FIND "${path}" "${d}/" at)
      if(at EQUAL 0 AND len GREATER best_len)
        set(best ${layer})
        set(best_len ${len})
      endif()
    endforeach()
  endforeach()
  set(${out} "${best}" PARENT_SCOPE)
endfunction()

# The root-relative .h/.cc files under `dirs` (recursively).
function(_stagecoach_files_under root dirs out)
  set(result "")
  foreach(d ${dirs})
    file(GLOB_RECURSE found RELATIVE ${root} ${root}/${d}/*.h ${root}/${d}/*.cc)
    list(APPEND result ${found})
  endforeach()
  list(SORT result)
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The header an #include line names, root-relative: a quoted or angle-bracketed path, resolved
# against the including file's folder when it starts with "./" or "../".
function(_stagecoach_included_header line file out)
  string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*" "\\1" header "${line}")
  if(header MATCHES "^\\.\\.?/")
    get_filename_component(dir "${file}" DIRECTORY)
    get_filename_component(resolved "/${dir}/${header}" ABSOLUTE)
    string(REGEX REPLACE "^/" "" header "${resolved}")
  endif()
  set(${out} "${header}" PARENT_SCOPE)
endfunction()

# Appends to `out` one message per include that crosses to a layer not among the includer's
# dependencies, per file under a root that belongs to no layer, and per dependency cycle.
function(stagecoach_layering_violations out)
  get_property(layers GLOBAL PROPERTY STAGECOACH_LAYERS)
  get_property(root GLOBAL PROPERTY STAGECOACH_LAYERING_ROOT)
  get_property(roots GLOBAL PROPERTY STAGECOACH_LAYERING_ROOTS)
  set(problems "")
  set(files "")
  foreach(layer ${layers})
    get_property(layer_root GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_ROOT)
    get_property(dirs GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DIRS)
    get_property(named GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_FILES)
    _stagecoach_files_under(${layer_root} "${dirs}" found)
    list(APPEND files ${found} ${named})
    if(NOT root)
      set(root ${layer_root})
    endif()
  endforeach()
  if(roots)
    _stagecoach_files_under(${root} "${roots}" found)
    list(APPEND files ${found})
  endif()
  list(REMOVE_DUPLICATES files)
  foreach(f ${files})
    _stagecoach_layer_of(${f} layer)
    if(layer STREQUAL "")
      list(APPEND problems "${f} belongs to no library (put it in the folder of its concern)")
      continue()
    endif()
    get_property(deps GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_DEPS)
    file(STRINGS ${root}/${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    foreach(line ${includes})
      _stagecoach_included_header("${line}" ${f} header)
      _stagecoach_layer_of(${header} owner)
      if(owner STREQUAL "" OR owner STREQUAL layer OR owner IN_LIST deps)
        continue()
      endif()
      list(APPEND problems
           "${f} includes ${header}: ${layer} does not link ${owner} (add the dependency, if it points down the layers, or move the code)")
    endforeach()
  endforeach()
  # Cycles: a walk from every layer along its dependencies that meets it again.
  foreach(start ${layers})
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

function(_stagecoach_fail_on_violations)
  stagecoach_layering_violations(problems)
  if(problems)
    list(JOIN problems "\n  " text)
    message(FATAL_ERROR "Layering (cmake/layering.cmake, docs/architecture.md):\n  ${text}")
  endif()
endfunction()

# Fills in the dependencies of the target layers from their LINK_LIBRARIES, or the LINKS they
# were declared with in a compile group (cmake/compile_groups.cmake), those that are layers
# themselves, fails the configuration on any violation, and has the build check again
# (target stagecoach_layering, which every layer's library waits for) whenever a file under the
# roots changes.
function(stagecoach_check_layering)
  get_property(targets GLOBAL PROPERTY STAGECOACH_LAYER_TARGETS)
  get_property(layers GLOBAL PROPERTY STAGECOACH_LAYERS)
  foreach(t ${targets})
    get_target_property(links ${t} STAGECOACH_LAYER_LINKS)
    if(NOT links)
      get_target_property(links ${t} LINK_LIBRARIES)
    endif()
    set(deps "")
    foreach(l ${links})
      if(l IN_LIST layers)
        list(APPEND deps ${l})
      endif()
    endforeach()
    set_property(GLOBAL PROPERTY STAGECOACH_LAYER_${t}_DEPS ${deps})
  endforeach()
  _stagecoach_fail_on_violations()

  # The registry the build's re-check reads.
  get_property(root GLOBAL PROPERTY STAGECOACH_LAYERING_ROOT)
  get_property(roots GLOBAL PROPERTY STAGECOACH_LAYERING_ROOTS)
  set(registry "stagecoach_layering_roots(ROOT \"${root}\" DIRS ${roots})\n")
  set(watched "")
  foreach(layer ${layers})
    foreach(p ROOT DIRS FILES DEPS)
      get_property(${p} GLOBAL PROPERTY STAGECOACH_LAYER_${layer}_${p})
    endforeach()
    string(APPEND registry "stagecoach_layer(${layer} ROOT \"${ROOT}\" DIRS ${DIRS} FILES ${FILES} DEPS ${DEPS})\n")
    foreach(d ${DIRS})
      file(GLOB_RECURSE found CONFIGURE_DEPENDS ${ROOT}/${d}/*.h ${ROOT}/${d}/*.cc)
      list(APPEND watched ${found})
    endforeach()
    foreach(f ${FILES})
      list(APPEND watched ${ROOT}/${f})
    endforeach()
  endforeach()
  foreach(d ${roots})
    file(GLOB_RECURSE found CONFIGURE_DEPENDS ${root}/${d}/*.h ${root}/${d}/*.cc)
    list(APPEND watched ${found})
  endforeach()
  list(REMOVE_DUPLICATES watched)
  set(registry_file ${CMAKE_BINARY_DIR}/layering_registry.cmake)
  file(WRITE ${registry_file} "${registry}")
  set(stamp ${CMAKE_BINARY_DIR}/layering.stamp)
  add_custom_command(OUTPUT ${stamp}
    COMMAND ${CMAKE_COMMAND} -DSTAGECOACH_LAYERING_REGISTRY=${registry_file}
            -P ${PROJECT_SOURCE_DIR}/cmake/layering.cmake
    COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
    DEPENDS ${watched} ${registry_file} ${PROJECT_SOURCE_DIR}/cmake/layering.cmake
    COMMENT "Checking the layering of coordinator/ and worker/"
    VERBATIM)
  add_custom_target(stagecoach_layering ALL DEPENDS ${stamp})
  foreach(t ${targets})
    add_dependencies(${t} stagecoach_layering)
  endforeach()
endfunction()

# Script mode: the build's re-check.
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE AND STAGECOACH_LAYERING_REGISTRY)
  include(${STAGECOACH_LAYERING_REGISTRY})
  _stagecoach_fail_on_violations()
endif()
