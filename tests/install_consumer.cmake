# CTest script: install the build tree into a scratch prefix, then configure, build and run a
# consumer project that uses find_package(gcomp), once with C and C++ enabled and once C++ only.
# Arguments: BUILD_DIR, WORK_DIR, SOURCE_DIR (tests/consumer; tests/consumer_cxx beside it).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_c)
if(EXISTS ${WORK_DIR}/build/consumer_mpi)
  run(${WORK_DIR}/build/consumer_mpi)
endif()
# C++ only.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/../consumer_cxx -B ${WORK_DIR}/build_cxx
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build_cxx)
run(${WORK_DIR}/build_cxx/consumer_cxx)
if(EXISTS ${WORK_DIR}/build_cxx/consumer_cxx_mpi)
  run(${WORK_DIR}/build_cxx/consumer_cxx_mpi)
endif()
