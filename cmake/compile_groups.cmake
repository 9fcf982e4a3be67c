# Compile groups: libraries that keep their names, folders, link lists and layers, but that a
# unity build compiles together, a few large translation units for many folders.
#
# Why: every translation unit pays a fixed cost for its headers. One that includes LibTorch spends
# about 20 s on it even with the headers precompiled (loading them, then instantiating the
# templates their inline functions use, then compiling those instantiations again); one that
# includes gRPC and protobuf about 6 s. The worker's eight LibTorch libraries were eight units;
# three of them compiled as one took 53 s against 94 s apart (docs/building.md). They are one
# unit now, the coordinator's libraries two.
#
#   stagecoach_group_library(name GROUP group SOURCES ... [LINKS ...] [PRIVATE_LINKS ...])
#     STAGECOACH_UNITY=OFF: `name` is a STATIC library of SOURCES linking LINKS PUBLIC and
#     PRIVATE_LINKS (header-only libraries, say) PRIVATE.
#     ON: `name` is an INTERFACE library that links the group's STATIC library `group`, and its
#     SOURCES compile in the group's one unity unit (files of several libraries in one unit:
#     their file-local names must not collide, STAGECOACH_UNITY=OFF checks that each file
#     includes what it uses). Either way `name` records LINKS as STAGECOACH_LAYER_LINKS,
#     which the layering check (cmake/layering.cmake) reads as the library's dependencies.
#   stagecoach_finish_group(group [COLD])
#     after the last library of the group: makes `group` (ON), linking the LINKS of its
#     libraries that are not themselves in it. COLD: every library of the group is
#     stagecoach_cold_code (-O1 in optimised builds). Either way a library or group whose files
#     include LibTorch reuses its precompiled headers (stagecoach_reuse_torch_pch).
#
# Each library's callers link `name` as before; with ON they get the whole group, which a static
# link trims to the objects used.

function(stagecoach_group_library name)
  cmake_parse_arguments(G "" "GROUP" "SOURCES;LINKS;PRIVATE_LINKS" ${ARGN})
  if(NOT G_GROUP OR NOT G_SOURCES)
    message(FATAL_ERROR "stagecoach_group_library(${name}): GROUP and SOURCES are needed")
  endif()
  if(NOT STAGECOACH_UNITY)
    add_library(${name} STATIC ${G_SOURCES})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} PUBLIC ${G_LINKS} PRIVATE ${G_PRIVATE_LINKS})
    set_target_properties(${name} PROPERTIES STAGECOACH_LAYER_LINKS "${G_LINKS}")
    stagecoach_reuse_torch_pch(${name})
    set_property(GLOBAL APPEND PROPERTY STAGECOACH_GROUP_${G_GROUP}_MEMBERS ${name})
    return()
  endif()
  add_library(${name} INTERFACE)
  target_link_libraries(${name} INTERFACE ${G_GROUP})
  set_target_properties(${name} PROPERTIES STAGECOACH_LAYER_LINKS "${G_LINKS}")
  foreach(src ${G_SOURCES})
    get_filename_component(path ${src} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    set_property(GLOBAL APPEND PROPERTY STAGECOACH_GROUP_${G_GROUP}_SOURCES ${path})
  endforeach()
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_GROUP_${G_GROUP}_MEMBERS ${name})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_GROUP_${G_GROUP}_LINKS ${G_LINKS})
  set_property(GLOBAL APPEND PROPERTY STAGECOACH_GROUP_${G_GROUP}_PRIVATE_LINKS ${G_PRIVATE_LINKS})
endfunction()

function(stagecoach_finish_group group)
  cmake_parse_arguments(F "COLD" "" "" ${ARGN})
  foreach(p SOURCES MEMBERS LINKS PRIVATE_LINKS)
    get_property(${p} GLOBAL PROPERTY STAGECOACH_GROUP_${group}_${p})
  endforeach()
  if(NOT STAGECOACH_UNITY)
    if(F_COLD)
      foreach(member ${MEMBERS})
        stagecoach_cold_code(${member})
      endforeach()
    endif()
    return()
  endif()
  if(NOT SOURCES)
    message(FATAL_ERROR "stagecoach_finish_group(${group}): no library joined the group")
  endif()
  list(REMOVE_DUPLICATES LINKS)
  list(REMOVE_ITEM LINKS ${MEMBERS})
  add_library(${group} STATIC ${SOURCES})
  target_include_directories(${group} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${group} PUBLIC ${LINKS} PRIVATE ${PRIVATE_LINKS})
  set_target_properties(${group} PROPERTIES UNITY_BUILD_BATCH_SIZE 0)  # one unit
  stagecoach_reuse_torch_pch(${group})
  if(F_COLD)
    stagecoach_cold_code(${group})
  endif()
  # The layering check runs before any of the group's files compiles, as before any layer's.
  add_dependencies(${group} stagecoach_layering)
endfunction()
