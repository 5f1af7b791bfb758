// A libFuzzer target: DDP_FUZZ_ENTRY names the entry (idx_entry, cifar10_entry, checkpoint_entry).
// A rejected input is fine; see Note [Fuzz inputs] for what counts as a crash.
#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ddp::fuzz::DDP_FUZZ_ENTRY(data, size, ddp::fuzz::process_scratch());
  return 0;
}
