#pragma once
// Timing statistics of DistributedDataParallel, like PyTorch's DDP logging data.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ddp {

// Averages over the synchronized iterations so far (iterations whose backward all-reduced).
// Note [Timing statistics]
// ~~~~~~~~~~~~~~~~~~~~~~~~
//   forward_ms:              wall time of forward (buffer broadcast included).
//   backward_compute_ms:     end of forward to the moment the last gradient is ready (as
//                            PyTorch's DDP: loss computation included).
//   communication_ms:        first bucket launch to the completion of the last all-reduce.
//   hidden_communication_ms: the part of communication_ms that ran while backward still computed.
//   exposed_wait_ms:         time backward's end spent waiting for all-reduces and copying back.
struct DdpStats {
  std::int64_t iterations = 0;
  double forward_ms = 0;
  double backward_compute_ms = 0;
  double communication_ms = 0;
  double hidden_communication_ms = 0;
  double exposed_wait_ms = 0;
  // Bucket layout: number of buckets and bytes of each, in launch order.
  std::vector<std::size_t> bucket_bytes;

  // hidden / communication, 0 when there was no communication.
  double hidden_share() const {
    return communication_ms > 0 ? hidden_communication_ms / communication_ms : 0.0;
  }
};

}  // namespace ddp
