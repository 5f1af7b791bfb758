#pragma once
// Note [Bucket assignment]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Gradients are all-reduced in buckets: one collective per bucket instead of one per parameter,
// started while backward still runs. Backward produces gradients roughly in reverse registration
// order (the last layer first), so buckets are filled walking the parameters from last to first.
// The first bucket is kept small (1 MiB by default) so that communication starts early; later ones
// are up to 25 MiB. A bucket holds one dtype on one device (it is one flat tensor). A bucket is
// closed as soon as it reaches its cap, so a parameter larger than the cap gets a bucket to itself.
// Buckets are returned in the order they become ready, which is the order they are launched in.
//
// Note [Bucket rebuild]
// ~~~~~~~~~~~~~~~~~~~~~
// Reverse registration order is only a guess at the order backward produces gradients: a module
// may register its layers in another order than it uses them (a head registered first, a branch
// used last). Then the parameters of a bucket become ready far apart, and a bucket whose gradients
// are all ready waits behind an earlier one that is not. So, as PyTorch does, DistributedDataParallel
// records the order in which gradients became ready during the first synchronized backward and, at
// the next synchronized forward, rebuilds the buckets once, walking the parameters in that order
// (`order` below). Rank 0's order is broadcast, so every rank builds the same buckets. Not done with
// find_unused_parameters (the ready order may change from one iteration to the next there; PyTorch
// does not rebuild either) and not when DdpOptions::rebuild_buckets is false.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <vector>

namespace ddp::detail {

struct BucketCaps {
  std::size_t first_bucket_bytes = std::size_t{1} << 20;   // 1 MiB
  std::size_t bucket_bytes = std::size_t{25} << 20;       // 25 MiB
};

// sizes[i] is parameter i's gradient size in bytes; dtypes[i], devices[i] its dtype and device
// (all three the same length). `order` is the order in which the gradients become ready, a
// permutation of 0..n-1; empty means reverse registration order (n-1, ..., 0). Returns buckets of
// parameter indices in the order they become ready; each bucket lists its parameters in `order`,
// and every index appears exactly once.
// Throws ddp::InvalidArgument when the lengths differ, a cap is 0 or `order` is not a permutation.
std::vector<std::vector<std::size_t>> compute_bucket_assignment(
    const std::vector<std::size_t>& sizes, const std::vector<c10::ScalarType>& dtypes,
    const std::vector<c10::Device>& devices, const BucketCaps& caps = {},
    const std::vector<std::size_t>& order = {});

}  // namespace ddp::detail
