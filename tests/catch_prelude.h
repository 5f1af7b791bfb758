#pragma once
// Force-included first into every Catch test translation unit (see ddp_add_catch_test).
//
// Note [Catch and LibTorch CHECK]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// LibTorch's c10/util/Logging.h defines a glog-style CHECK(cond) that aborts the process. Included
// after catch.hpp it silently replaces Catch's CHECK: a failing check then kills the test program
// instead of being reported, and passing checks are not counted. Including Logging.h here, before
// anything else, and dropping its CHECK lets catch.hpp define CHECK last, whatever order a test file
// includes its headers in (Logging.h is not read twice). Tests without LibTorch skip this.
#if __has_include(<c10/util/Logging.h>)
#include <c10/util/Logging.h>
#undef CHECK
#endif
