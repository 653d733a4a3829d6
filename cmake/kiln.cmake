# kiln_stage(NAME DIR [DEPS ...]): one static library per src/ stage, from the folder's *.cpp (not recursive).
function(kiln_stage name dir)
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cpp)
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PUBLIC ${ARGN} PRIVATE kiln_warnings)
  if(KILN_HAVE_CUDA)
    target_compile_definitions(${name} PUBLIC KILN_HAVE_CUDA=1)
  endif()
endfunction()

# kiln_test(FILE LABEL LIBS...): one gtest executable per test file; each TEST becomes a ctest case.
include(GoogleTest)
function(kiln_test file label)
  get_filename_component(name ${file} NAME_WE)
  add_executable(${name} ${file})
  target_link_libraries(${name} PRIVATE ${ARGN} GTest::gtest GTest::gtest_main kiln_warnings)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    KILN_SOURCE_DIR="${PROJECT_SOURCE_DIR}" KILN_BINARY_DIR="${PROJECT_BINARY_DIR}")
  # The MoE startup tuner picks kernels by timing: off under ctest so a test's kernels never depend on it
  # (test_cuda_moe_tune turns it on where it tests it).
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS ${label} SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]" ENVIRONMENT "KILN_MOE_TUNE=0")
endfunction()
