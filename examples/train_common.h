#pragma once
// The training program shared by train_fashion_mnist and train_cifar10: parses the command line,
// trains in single, dp or ddp mode, reports progress and figures. Free of LibTorch headers, so the
// programs' main files compile in a second.
#include "examples/train_options.h"

namespace ddp::examples {

// Runs the program described by spec. Returns the exit code: 0, 2 for a bad command line, 1 for any
// other error (after printing it in one line).
int train_main(int argc, char** argv, const ProgramSpec& spec);

}  // namespace ddp::examples
