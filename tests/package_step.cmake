# step(WHAT COMMAND...): runs a command of a package test, prints its output under "== WHAT", stops
# the test when it fails; its output is left in step_output.
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("== ${what}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()
