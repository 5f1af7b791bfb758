#pragma once
// Note [Bucket assignment]
// Gradients are all-reduced in buckets: one collective per bucket instead of one per parameter,
// started while backward still runs. Backward produces gradients roughly in reverse registration
// order (the last layer first), so buckets are filled walking the parameters from last to first.
// The first bucket is kept small (1 MiB by default) so that communication starts early; later ones
// are up to 25 MiB. A bucket holds one dtype on one device (it is one flat tensor). A bucket is
// closed as soon as it reaches its cap, so a parameter larger than the cap gets a bucket to itself.
// Buckets are returned in the order they become ready, which is the order they are launched in.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <vector>

namespace ddp {

struct BucketCaps {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;   // 1 MiB
  std::size_t bucket_bytes = std::size_t{25} << 20;       // 25 MiB
};

// sizes[i] is parameter i's gradient size in bytes; dtypes[i], devices[i] its dtype and device
// (all three the same length). Returns buckets of parameter indices; each bucket lists its
// parameters in reverse registration order, and every index appears exactly once.
// Throws ddp::InvalidArgument when the lengths differ or a cap is 0.
std::vector<std::vector<std::size_t>> compute_bucket_assignment(
    const std::vector<std::size_t>& sizes, const std::vector<c10::ScalarType>& dtypes,
    const std::vector<c10::Device>& devices, const BucketCaps& caps = {});

}  // namespace ddp
