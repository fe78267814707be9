# ctest: configure and build tests/consumer against the staged install, then run what it built.
#   cmake -DSTAGE=... -DWORK=... -DSOURCE=... -DGENERATOR=... -P run.cmake
include(${CMAKE_CURRENT_LIST_DIR}/../package_step.cmake)

set(scenario ${SOURCE}/double_it.json)
file(REMOVE_RECURSE ${WORK})
step("configure against ${STAGE}" ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK} -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${STAGE})
step("build" ${CMAKE_COMMAND} --build ${WORK} -j1)
step("the consumer runs its scenario" ${WORK}/consumer ${scenario})
step("a meshsim of its own" ${WORK}/consumer_meshsim run ${scenario})
if(NOT step_output MATCHES "double_it: pass")
  message(FATAL_ERROR "consumer_meshsim did not pass the scenario")
endif()
step("the installed command with the plugin" ${STAGE}/bin/meshsim --plugin ${WORK}/libconsumer_plugin.so run ${scenario})
if(NOT step_output MATCHES "gradient_equivalence=ok")
  message(FATAL_ERROR "the plugin's Function was not checked by the oracle")
endif()
# pkg-config: the one-file consumer compiled and linked with the flags meshsim.pc gives.
set(ENV{PKG_CONFIG_PATH} ${STAGE}/lib/pkgconfig)
step("pkg-config" pkg-config --cflags --libs meshsim)
string(STRIP "${step_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
step("compile with pkg-config's flags" c++ -std=c++17 -O0 ${SOURCE}/consumer.cpp -o ${WORK}/consumer_pc ${flags})
step("the pkg-config build runs" ${WORK}/consumer_pc ${scenario})
# A plugin's project with find_package(meshsim COMPONENTS plugin) where CLI11, RapidCheck and
# pkg-config cannot be found: the plugin route needs none of them (it required all, CUDA included).
step("configure a plugin alone" ${CMAKE_COMMAND} -S ${SOURCE}/plugin_only -B ${WORK}/plugin_only -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${STAGE} -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON
     -DCMAKE_DISABLE_FIND_PACKAGE_rapidcheck=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON
     -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
step("build the plugin alone" ${CMAKE_COMMAND} --build ${WORK}/plugin_only -j1)
step("the installed command with that plugin" ${STAGE}/bin/meshsim --plugin ${WORK}/plugin_only/libplugin_only.so run ${scenario})
if(NOT step_output MATCHES "gradient_equivalence=ok")
  message(FATAL_ERROR "the plugin built with the plugin component alone was not checked by the oracle")
endif()
