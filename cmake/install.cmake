# `cmake --install` and the CMake package (find_package(meshsim)), pkg-config and the Debian package
# (cpack -G DEB). Targets, under the namespace meshsim:: (docs/cpp-api.md, README "Install"):
#   meshsim::meshsim     the public API (meshsim/meshsim.h): run scenarios, register Functions
#   meshsim::main        meshsim::main, the whole command line (check needs RapidCheck)
#   meshsim::properties  the property suite (RapidCheck), which meshsim::main links
#   meshsim::plugin      what a plugin builds against: the header, libtorch and nlohmann_json only
# The other static libraries are exported as internal_* because static libraries need them to link;
# their headers are not installed.
include(CMakePackageConfigHelpers)

set_target_properties(meshsim_api PROPERTIES EXPORT_NAME meshsim)
set_target_properties(meshsim_cli PROPERTIES EXPORT_NAME main)
set_target_properties(meshsim_properties PROPERTIES EXPORT_NAME properties)
set_target_properties(meshsim_plugin_interface PROPERTIES EXPORT_NAME plugin)
foreach(lib core traces sim oracles values validate cli_front)
  set_target_properties(meshsim_${lib} PROPERTIES EXPORT_NAME internal_${lib})
endforeach()

install(TARGETS meshsim RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS meshsim_torch_command RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/meshsim)
install(TARGETS meshsim_api meshsim_cli meshsim_cli_front meshsim_properties meshsim_plugin_interface meshsim_torch
                meshsim_core meshsim_traces meshsim_sim meshsim_oracles meshsim_values meshsim_validate
        EXPORT meshsimTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/meshsim/meshsim.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/meshsim)
install(EXPORT meshsimTargets NAMESPACE meshsim:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshsim)

# What the installed targets' link lines name, for the package config to find again.
get_property(MESHSIM_WITH_NCCL GLOBAL PROPERTY MESHSIM_WITH_NCCL)
if(NOT MESHSIM_WITH_NCCL)
  set(MESHSIM_WITH_NCCL OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/meshsimConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/meshsimConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshsim)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/meshsimConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/meshsimConfig.cmake ${PROJECT_BINARY_DIR}/meshsimConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meshsim)

# pkg-config: the public API (meshsim::meshsim's link line).
configure_file(${PROJECT_SOURCE_DIR}/cmake/meshsim.pc.in ${PROJECT_BINARY_DIR}/meshsim.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/meshsim.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Documentation, examples and the man page (written from the command's own --help at build time).
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DATADIR}/meshsim/examples)
# meshsim import and tools/crosscheck (Python; their packages come from PyPI when first used).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/ DESTINATION ${CMAKE_INSTALL_DATADIR}/meshsim/tools USE_SOURCE_PERMISSIONS
        PATTERN "__pycache__" EXCLUDE)
add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/meshsim.1
                   COMMAND ${CMAKE_COMMAND} -DMESHSIM=$<TARGET_FILE:meshsim> -DOUT=${PROJECT_BINARY_DIR}/meshsim.1
                           -DVERSION=${PROJECT_VERSION} -P ${PROJECT_SOURCE_DIR}/cmake/manpage.cmake
                   DEPENDS meshsim ${PROJECT_SOURCE_DIR}/cmake/manpage.cmake
                   COMMENT "meshsim.1 from meshsim --help")
add_custom_target(meshsim_manpage ALL DEPENDS ${PROJECT_BINARY_DIR}/meshsim.1)
# Everything `cmake --install` and cpack install, and nothing else (no test): what the README's main
# job builds (scripts/setup.sh examples), so that its install routes work from that build.
add_custom_target(meshsim_installable DEPENDS meshsim meshsim_torch_command meshsim_manpage meshsim_api meshsim_cli meshsim_properties)
# install (and cpack, which runs it) needs what is installed, not every target of the build: the
# tests' targets take most of a clean build's time.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
install(FILES ${PROJECT_BINARY_DIR}/meshsim.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# cpack -G DEB: meshsim_VERSION_amd64.deb, installed under /usr. Its dependencies are the Debian
# runtime packages of the installed command; where the NCCL engine is built, the command also needs
# the CUDA runtime and NCCL of /usr/local/cuda, which no Debian package provides.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME meshsim)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "meshsim developers <meshsim@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "deterministic simulator and testing harness for distributed tensor semantics")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "meshsim runs PyTorch-style DTensor placements (Shard, Replicate, Partial, Reduced), LTensor variance\n tracking inside local_map and custom autograd Functions on a fake multi-rank mesh in one process,\n checks them against a single-device oracle, property-tests them, and draws their dataflow.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Built against a torch wheel's libtorch (cmake/torch.cmake), the package depends on no libtorch
# package: the command finds the wheel's libraries by run path, on this machine only.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libgvc6, libxxhash0, libstdc++6")
if(MESHSIM_MALLOC STREQUAL "jemalloc")
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS ", libjemalloc2")
endif()
if(MESHSIM_TORCH_DEB_DEPENDS)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${MESHSIM_TORCH_DEB_DEPENDS}, ${CPACK_DEBIAN_PACKAGE_DEPENDS}")
endif()
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libtorch-dev, nlohmann-json3-dev, libgraphviz-dev, libxxhash-dev, librapidcheck-dev, libcli11-dev")
include(CPack)
