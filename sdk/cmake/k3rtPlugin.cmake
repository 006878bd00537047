# k3rt_add_plugin(<name> SOURCES <files>... [CUDA_SOURCES <.cu files>...]
#                 [OUTPUT_NAME <file name>] [INSTALL])
#
# Builds lib<name>.so as a k3rt plugin: a MODULE library compiled as C11 with hidden
# visibility (only k3rt_plugin_entry, marked by K3RT_PLUGIN_EXPORT, is exported), linked to
# libk3rt. Name it libk3rt_<name>.so (OUTPUT_NAME k3rt_<name>) when you want the plugin found by
# name on K3RT_PLUGIN_PATH; a recipe can load any file by path with k3.plugin("path", {...}).
# CUDA_SOURCES are built in when the project has enabled CUDA (project(... LANGUAGES C CUDA) or
# enable_language(CUDA), which CMake allows only at file scope); the plugin is then compiled with
# K3RT_PLUGIN_HAVE_CUDA=1 and linked to the CUDA runtime, and should declare K3RT_CAP_CUDA only
# under that macro. Without CUDA the plugin is built from SOURCES alone.
# INSTALL adds an install rule into <libdir>/k3rt/plugins of the install prefix.
# Also adds a test `<name>.check-plugin` that runs `k3rt check-plugin` on the built file when
# the project calls enable_testing().
include(GNUInstallDirs)

function(k3rt_add_plugin name)
  cmake_parse_arguments(P "INSTALL" "OUTPUT_NAME" "SOURCES;CUDA_SOURCES" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "k3rt_add_plugin(${name}): no SOURCES")
  endif()
  set(srcs ${P_SOURCES})
  set(with_cuda OFF)
  if(P_CUDA_SOURCES AND CMAKE_CUDA_COMPILER_LOADED)
    list(APPEND srcs ${P_CUDA_SOURCES})
    set(with_cuda ON)
  endif()
  add_library(${name} MODULE ${srcs})
  set_target_properties(${name} PROPERTIES
    PREFIX lib
    C_STANDARD 11 C_STANDARD_REQUIRED ON
    C_VISIBILITY_PRESET hidden)
  if(P_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${P_OUTPUT_NAME})
  endif()
  target_link_libraries(${name} PRIVATE k3rt::k3rt m)
  if(with_cuda)
    find_package(CUDAToolkit REQUIRED)
    set_target_properties(${name} PROPERTIES CUDA_VISIBILITY_PRESET hidden)
    target_compile_definitions(${name} PRIVATE K3RT_PLUGIN_HAVE_CUDA=1)
    target_link_libraries(${name} PRIVATE CUDA::cudart)
  endif()
  if(P_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/k3rt/plugins)
  endif()
  if(TARGET k3rt::k3rt_cli)
    add_test(NAME ${name}.check-plugin
             COMMAND k3rt::k3rt_cli check-plugin $<TARGET_FILE:${name}>)
  endif()
endfunction()
