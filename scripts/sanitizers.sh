# Sourced by scripts/test.sh --sanitize and scripts/fuzz.sh: the run-time options of ASan, UBSan and
# LSan for our instrumented executables (children such as ddp_launch's workers inherit them).
#   halt_on_error, print_stacktrace: the first report ends the process with a stack trace, so that a
#   test fails on it instead of a message scrolling by.
#   exitcode=23 (ASan's default is 1): tells a sanitizer report from an ordinary test failure.
ddp_export_sanitizer_options() {
  export ASAN_OPTIONS="halt_on_error=1:symbolize=1:detect_leaks=${DDP_DETECT_LEAKS:-1}:exitcode=23"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:symbolize=1"
  export LSAN_OPTIONS="suppressions=$DDP_ROOT/scripts/lsan.supp:print_suppressions=0"
}
