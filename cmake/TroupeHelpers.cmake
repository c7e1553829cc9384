# Shared CMake helpers: warnings, library and test registration.

# Warnings for project code; errors when TROUPE_WERROR is on.
function(troupe_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  if(TROUPE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# troupe_add_library(<folder> SOURCES ... DEPS ... [TORCH])
# Creates troupe_<folder> with alias troupe::<folder>; public headers live in
# <folder>/include/troupe/<folder>/, private ones next to the sources.
function(troupe_add_library name)
  cmake_parse_arguments(A "TORCH" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(troupe_${name} ${A_SOURCES})
  add_library(troupe::${name} ALIAS troupe_${name})
  target_include_directories(troupe_${name}
    PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(troupe_${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  if(A_TORCH)
    target_link_libraries(troupe_${name} PUBLIC ${TORCH_LIBRARIES})
  endif()
  troupe_warnings(troupe_${name})
  if(NOT A_TORCH)
    troupe_common_pch(troupe_${name})
  endif()
endfunction()

# troupe_common_pch(<target>)
# Torch-free libraries share one precompiled header of what nearly every source
# includes (nlohmann::json, spdlog, fmt, the standard containers): ~5 s to build
# once, ~1-3 s less parsing per source. Owned by troupe_core (built first).
# Nothing of torch: transport/ and launcher/ never see a torch header (CTest
# torch_free_check). Not for
# targets that link torch: its -D_GLIBCXX_USE_CXX11_ABI makes gcc refuse it.
function(troupe_common_pch target)
  troupe_shared_pch(TROUPE_COMMON_PCH_OWNER ${target}
    <nlohmann/json.hpp> <spdlog/spdlog.h> <fmt/format.h>
    <chrono> <functional> <map> <memory> <mutex> <optional> <string> <thread> <vector>)
endfunction()

# troupe_shared_pch(<owner property> <target> <header>...)
# The first target given a property owns a precompiled header of <header>...;
# later ones reuse it. Nothing when TROUPE_TORCH_PCH is off.
function(troupe_shared_pch property target)
  if(NOT TROUPE_TORCH_PCH)
    return()
  endif()
  get_property(owner GLOBAL PROPERTY ${property})
  if(owner)
    target_precompile_headers(${target} REUSE_FROM ${owner})
  else()
    target_precompile_headers(${target} PRIVATE ${ARGN})
    set_property(GLOBAL PROPERTY ${property} ${target})
  endif()
endfunction()

# troupe_torch_pch(<target> SOURCES ...)
# The listed sources (those that include the whole torch C++ API through
# model.h or learner.h: ~14 s of parsing each) use one precompiled header of
# <torch/nn/module.h> and <ATen/ATen.h>. The first target to call this owns it,
# the others reuse it (one ~28 s header build for the whole project). The other
# sources of the target skip it: loading the 400 MB header costs ~3.5 s, more
# than a light torch include. -DTROUPE_TORCH_PCH=OFF turns off both
# precompiled headers (this one and troupe_common_pch).
function(troupe_torch_pch target)
  cmake_parse_arguments(A "" "" "SOURCES" ${ARGN})
  troupe_shared_pch(TROUPE_TORCH_PCH_OWNER ${target} <torch/nn/module.h> <ATen/ATen.h>)
  get_target_property(sources ${target} SOURCES)
  foreach(src ${sources})
    if(NOT src IN_LIST A_SOURCES)
      set_source_files_properties(${src} TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
endfunction()

# troupe_cold_code(<target>...)
# Code that runs once per job or command (the CLI and the actor host's argument
# parsing, the head, config and job parsing) is built at -O1 in Release: it is
# mostly templates (CLI11, nlohmann::json, fmt, yaml-cpp) whose -O3 costs about
# a third more build time, and none of it is on a per-token path.
function(troupe_cold_code)
  foreach(target ${ARGN})
    target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O1>)
  endforeach()
endfunction()

# troupe_add_test(<name> SOURCES ... LIBS ... LABELS ... [TIMEOUT s] [SERIAL] [OWN_MAIN])
# OWN_MAIN: the test defines main() itself (e.g. to re-exec itself as a child).
# One executable per test file, registered with CTest (gtest_discover_tests would
# run every binary at build time, which costs minutes on 2 cores, so we register
# the binary as one CTest test and let GoogleTest run its cases).
function(troupe_add_test name)
  cmake_parse_arguments(A "SERIAL;OWN_MAIN" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_LIBS} GTest::gtest GTest::gmock Threads::Threads)
  if(NOT A_OWN_MAIN)
    target_link_libraries(${name} PRIVATE GTest::gtest_main)
  endif()
  troupe_warnings(${name})
  add_test(NAME ${name} COMMAND ${name} --gtest_color=no)
  set_tests_properties(${name} PROPERTIES
    TIMEOUT ${A_TIMEOUT}
    LABELS "${A_LABELS}"
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;OMP_NUM_THREADS=1;TROUPE_BUILD_DIR=${CMAKE_BINARY_DIR};TROUPE_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
  if(A_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

# Finds CUDA runtime + NCCL under /usr/local/cuda (or CUDA_HOME) and defines
# the imported target troupe_nccl_deps and TROUPE_HAVE_NCCL.
function(troupe_find_nccl)
  set(TROUPE_HAVE_NCCL OFF PARENT_SCOPE)
  if(NOT TROUPE_WITH_NCCL)
    return()
  endif()
  set(_hints /usr/local/cuda $ENV{CUDA_HOME})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_hints} PATH_SUFFIXES include)
  find_path(CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${_hints} PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS ${_hints} PATH_SUFFIXES lib64 lib)
  find_library(CUDART_LIBRARY cudart HINTS ${_hints} PATH_SUFFIXES lib64 lib)
  if(NCCL_INCLUDE_DIR AND CUDART_INCLUDE_DIR AND NCCL_LIBRARY AND CUDART_LIBRARY)
    add_library(troupe_nccl_deps INTERFACE IMPORTED GLOBAL)
    target_include_directories(troupe_nccl_deps SYSTEM INTERFACE ${NCCL_INCLUDE_DIR} ${CUDART_INCLUDE_DIR})
    target_link_libraries(troupe_nccl_deps INTERFACE ${NCCL_LIBRARY} ${CUDART_LIBRARY})
    set(TROUPE_HAVE_NCCL ON PARENT_SCOPE)
    message(STATUS "troupe: NCCL backend enabled (${NCCL_LIBRARY})")
  else()
    message(STATUS "troupe: NCCL/CUDA not found, NCCL backend not built")
  endif()
endfunction()
