# libtorch, as the target meshsim_torch (exported as meshsim::torch): libtorch_cpu and c10, the
# only parts meshsim uses (CPU ATen, autograd, c10d's Gloo process group and stores).
#
# Two sources (README, "Building against a newer libtorch (the PyPI wheel)"):
#   - Debian's libtorch-dev (1.13), the default and what CI builds: headers under /usr/include, no
#     TorchConfig.cmake; the libraries are found by find_library.
#   - the libtorch inside a PyPI torch wheel, where CMAKE_PREFIX_PATH (or Torch_DIR) names a folder
#     with a TorchConfig.cmake: -DCMAKE_PREFIX_PATH=$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The wheel's TorchConfig.cmake is not run: it loads Caffe2's CUDA detection (a CUDA build of the
# wheel fails without the matching toolkit) and links libtorch_cuda, which meshsim never needs. Its
# folder gives the prefix (<prefix>/share/cmake/Torch), and the prefix the headers and libraries.
#
# Sets TORCH_CPU_LIBRARY and C10_LIBRARY (absolute paths, named again by the package config),
# MESHSIM_TORCH_INCLUDE_DIRS (empty for Debian's, whose headers are in the compiler's default path),
# MESHSIM_TORCH_CXX_STANDARD, and what pkg-config and the Debian package say.

set(_meshsim_torch_hints)
if(DEFINED Torch_DIR)
  list(APPEND _meshsim_torch_hints ${Torch_DIR})
endif()
foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
  # torch.utils.cmake_prefix_path is <prefix>/share/cmake; a plain install prefix works too.
  list(APPEND _meshsim_torch_hints ${prefix}/Torch ${prefix}/share/cmake/Torch)
endforeach()
set(MESHSIM_TORCH_CONFIG_DIR "")
foreach(dir IN LISTS _meshsim_torch_hints)
  if(EXISTS ${dir}/TorchConfig.cmake)
    get_filename_component(MESHSIM_TORCH_CONFIG_DIR ${dir} ABSOLUTE)
    break()
  endif()
endforeach()

add_library(meshsim_torch INTERFACE)
set_target_properties(meshsim_torch PROPERTIES EXPORT_NAME torch)

if(NOT MESHSIM_TORCH_CONFIG_DIR)
  # libtorch from Debian's libtorch-dev: headers under /usr/include, no TorchConfig.cmake.
  find_library(TORCH_CPU_LIBRARY torch_cpu REQUIRED)
  find_library(C10_LIBRARY c10 REQUIRED)
  target_link_libraries(meshsim_torch INTERFACE ${TORCH_CPU_LIBRARY} ${C10_LIBRARY})
  set(MESHSIM_TORCH_INCLUDE_DIRS "")
  set(MESHSIM_TORCH_CXX_STANDARD 17)
  set(MESHSIM_TORCH_PC_CFLAGS "")
  set(MESHSIM_TORCH_PC_LIBS "-ltorch_cpu -lc10")
  set(MESHSIM_TORCH_DEB_DEPENDS "libtorch1.13")
  return()
endif()

# The libtorch of a torch wheel (or of any libtorch install with a TorchConfig.cmake).
get_filename_component(MESHSIM_TORCH_PREFIX ${MESHSIM_TORCH_CONFIG_DIR}/../../.. ABSOLUTE)
set(MESHSIM_TORCH_VERSION unknown)
if(EXISTS ${MESHSIM_TORCH_CONFIG_DIR}/TorchConfigVersion.cmake)
  file(STRINGS ${MESHSIM_TORCH_CONFIG_DIR}/TorchConfigVersion.cmake _v REGEX "set\\(PACKAGE_VERSION \"")
  string(REGEX REPLACE ".*PACKAGE_VERSION \"([^\"]*)\".*" "\\1" MESHSIM_TORCH_VERSION "${_v}")
endif()
# The C++ standard its headers need, as its own config asks for it (2.x: cxx_std_17 or cxx_std_20;
# ATen.h stops with an #error below it). meshsim is C++17 and compiles as C++20 where asked.
file(STRINGS ${MESHSIM_TORCH_CONFIG_DIR}/TorchConfig.cmake _std REGEX "cxx_std_[0-9]+" LIMIT_COUNT 1)
set(MESHSIM_TORCH_CXX_STANDARD 17)
if(_std MATCHES "cxx_std_([0-9]+)" AND CMAKE_MATCH_1 GREATER 17)
  set(MESHSIM_TORCH_CXX_STANDARD ${CMAKE_MATCH_1})
endif()

set(TORCH_CPU_LIBRARY ${MESHSIM_TORCH_PREFIX}/lib/${CMAKE_SHARED_LIBRARY_PREFIX}torch_cpu${CMAKE_SHARED_LIBRARY_SUFFIX})
set(C10_LIBRARY ${MESHSIM_TORCH_PREFIX}/lib/${CMAKE_SHARED_LIBRARY_PREFIX}c10${CMAKE_SHARED_LIBRARY_SUFFIX})
set(MESHSIM_TORCH_INCLUDE_DIRS ${MESHSIM_TORCH_PREFIX}/include ${MESHSIM_TORCH_PREFIX}/include/torch/csrc/api/include)
foreach(f ${TORCH_CPU_LIBRARY} ${C10_LIBRARY} ${MESHSIM_TORCH_PREFIX}/include/ATen/ATen.h)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "meshsim: ${MESHSIM_TORCH_CONFIG_DIR}/TorchConfig.cmake found, but not ${f}")
  endif()
endforeach()
message(STATUS "meshsim: libtorch ${MESHSIM_TORCH_VERSION} from ${MESHSIM_TORCH_PREFIX} "
               "(C++${MESHSIM_TORCH_CXX_STANDARD}; CPU only, its TorchConfig.cmake not run)")

target_link_libraries(meshsim_torch INTERFACE ${TORCH_CPU_LIBRARY} ${C10_LIBRARY})
# SYSTEM: the warnings of libtorch's headers are libtorch's, even with MESHSIM_WERROR. The
# installed package adds the folders itself (meshsimConfig.cmake): an export may not name folders
# in the source tree, where build/crosscheck/venv-pytorch lies.
target_include_directories(meshsim_torch SYSTEM INTERFACE
                           "$<BUILD_INTERFACE:${MESHSIM_TORCH_INCLUDE_DIRS}>")
target_compile_features(meshsim_torch INTERFACE cxx_std_${MESHSIM_TORCH_CXX_STANDARD})
# The wheel has no gloo headers (its libtorch_cpu carries Gloo inside); c10d's ProcessGroupGloo.hpp
# takes them from Debian's libgloo-dev under /usr/include, as the Debian build does.
if(NOT EXISTS ${MESHSIM_TORCH_PREFIX}/include/gloo/context.h AND NOT EXISTS /usr/include/gloo/context.h)
  message(WARNING "meshsim: no gloo headers (apt-get install libgloo-dev): gpu_validate will not compile")
endif()

# pkg-config (cmake/meshsim.pc.in) and the Debian package: the wheel is no Debian package, and the
# command finds its libraries by run path.
set(_includes "")
foreach(dir IN LISTS MESHSIM_TORCH_INCLUDE_DIRS)
  string(APPEND _includes " -isystem ${dir}")
endforeach()
set(MESHSIM_TORCH_PC_CFLAGS " -std=c++${MESHSIM_TORCH_CXX_STANDARD}${_includes}")
set(MESHSIM_TORCH_PC_LIBS "-L${MESHSIM_TORCH_PREFIX}/lib -Wl,-rpath,${MESHSIM_TORCH_PREFIX}/lib -ltorch_cpu -lc10")
set(MESHSIM_TORCH_DEB_DEPENDS "")

# The installed command and libraries find the wheel's libtorch by run path. CMake's
# CMAKE_INSTALL_RPATH_USE_LINK_PATH keeps only link directories outside the project, and a venv
# inside the source tree (build/crosscheck/venv-pytorch, the one tools/crosscheck makes) is not: so
# the wheel's lib/ is named outright.
list(APPEND CMAKE_INSTALL_RPATH ${MESHSIM_TORCH_PREFIX}/lib)
