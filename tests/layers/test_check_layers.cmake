# Tests cmake/check_layers.cmake: the real lib/ passes; a synthetic tree with an upward include
# (io -> model), an apps header included from lib/ and an unknown layer folder fails, naming each
# file:line and edge, while allowed edges (model -> io, same-layer) pass.
# Usage: cmake -DROOT=<source dir> -DWORK=<scratch dir> -P tests/layers/test_check_layers.cmake
set(check ${ROOT}/cmake/check_layers.cmake)

execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${ROOT} -P ${check}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the source tree fails its own layer check:\n${out}")
endif()

file(REMOVE_RECURSE ${WORK})
file(WRITE ${WORK}/lib/mmpost/io/bad.h "// io header\n#pragma once\n\n#include \"mmpost/io/ok.h\"\n#include \"mmpost/model/vlm.h\"\n")
file(WRITE ${WORK}/lib/mmpost/io/ok.h "#pragma once\n#include \"mmpost/core/check.h\"\n")
file(WRITE ${WORK}/lib/mmpost/model/vlm.h "#pragma once\n#include \"mmpost/io/ok.h\"\n#include <mmpost/algo/kl.h>\n")
file(WRITE ${WORK}/lib/mmpost/data/x.cpp "// a [ bracket ; and semicolon\n  #  include <mmpost/stage_common.h>\n// #include \"mmpost/train/run.h\"\n")
file(WRITE ${WORK}/lib/mmpost/widgets/w.h "#pragma once\n")
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${WORK} -P ${check}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "a wrong-way include passed the layer check:\n${out}")
endif()
foreach(expected
    "lib/mmpost/io/bad.h:5: error: #include \"mmpost/model/vlm.h\": io -> model points the wrong way (io may use: core)"
    "lib/mmpost/data/x.cpp:2: error: #include \"mmpost/stage_common.h\": data -> apps"
    "lib/mmpost/widgets/: error: \"widgets\" is not a layer"
    "mmpost layer check: 3 error(s)")
  string(FIND "${out}" "${expected}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "expected \"${expected}\" in the layer check's output:\n${out}")
  endif()
endforeach()
foreach(unexpected "lib/mmpost/model/vlm.h:" "lib/mmpost/io/ok.h:" "train/run.h")
  string(FIND "${out}" "${unexpected}" pos)
  if(NOT pos EQUAL -1)
    message(FATAL_ERROR "allowed or commented include \"${unexpected}\" reported:\n${out}")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
message(STATUS "layer check: source tree passes; the synthetic violations fail as expected")
