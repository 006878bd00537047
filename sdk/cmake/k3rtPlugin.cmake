# k3rt_add_plugin(<name> SOURCES <files>... [OUTPUT_NAME <file name>] [INSTALL])
#
# Builds lib<name>.so as a k3rt plugin: a MODULE library compiled as C11 with hidden
# visibility (only k3rt_plugin_entry, marked by K3RT_PLUGIN_EXPORT, is exported), linked to
# libk3rt. Name it libk3rt_<name>.so (OUTPUT_NAME k3rt_<name>) when you want the plugin found by
# name on K3RT_PLUGIN_PATH; a recipe can load any file by path with k3.plugin("path", {...}).
# INSTALL adds an install rule into <libdir>/k3rt/plugins of the install prefix.
# Also adds a test `<name>.check-plugin` that runs `k3rt check-plugin` on the built file when
# the project calls enable_testing().
include(GNUInstallDirs)

function(k3rt_add_plugin name)
  cmake_parse_arguments(P "INSTALL" "OUTPUT_NAME" "SOURCES" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "k3rt_add_plugin(${name}): no SOURCES")
  endif()
  add_library(${name} MODULE ${P_SOURCES})
  set_target_properties(${name} PROPERTIES
    PREFIX lib
    C_STANDARD 11 C_STANDARD_REQUIRED ON
    C_VISIBILITY_PRESET hidden)
  if(P_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${P_OUTPUT_NAME})
  endif()
  target_link_libraries(${name} PRIVATE k3rt::k3rt m)
  if(P_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/k3rt/plugins)
  endif()
  if(TARGET k3rt::k3rt_cli)
    add_test(NAME ${name}.check-plugin
             COMMAND k3rt::k3rt_cli check-plugin $<TARGET_FILE:${name}>)
  endif()
endfunction()
