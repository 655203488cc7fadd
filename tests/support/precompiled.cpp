// The source of the object libraries that build tests/support/precompiled.hpp
// (weft_precompiled_test_headers in cmake/weft_test_helpers.cmake): a target needs one.
