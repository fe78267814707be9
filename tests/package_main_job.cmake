# ctest: every install route of the README works from the build the main job leaves (issue #37,
# item 9). The main job (scripts/setup.sh examples) builds one target; with the man page removed,
# that target alone must give `cmake --install` and `cpack -G DEB` all they install.
#   cmake -DBUILD=... -DWORK=... -DSETUP=scripts/setup.sh -P package_main_job.cmake
include(${CMAKE_CURRENT_LIST_DIR}/package_step.cmake)

file(READ ${SETUP} setup)
string(REGEX MATCH "\n[^#\n]*cmake --build [^\n]*--target ([A-Za-z0-9_]+)\nmkdir -p out/diagrams" found "${setup}")
if(NOT found)
  message(FATAL_ERROR "scripts/setup.sh: no main-job build line (cmake --build ... --target T before mkdir -p out/diagrams)")
endif()
set(target ${CMAKE_MATCH_1})
file(REMOVE ${BUILD}/meshsim.1)
file(REMOVE_RECURSE ${WORK})
step("build the main job's target ${target}" ${CMAKE_COMMAND} --build ${BUILD} --target ${target})
step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
if(NOT EXISTS ${WORK}/prefix/share/man/man1/meshsim.1)
  message(FATAL_ERROR "the install has no man page")
endif()
step("cpack -G DEB" ${CMAKE_COMMAND} -E chdir ${BUILD} cpack -G DEB -B ${WORK}/deb)
file(GLOB debs ${WORK}/deb/*.deb)
if(NOT debs)
  message(FATAL_ERROR "cpack gave no package")
endif()
