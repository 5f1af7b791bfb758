#include "ddp/parallel/detail/bucket.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "ddp/base/error.h"

namespace ddp::detail {

std::vector<std::vector<std::size_t>> compute_bucket_assignment(
    const std::vector<std::size_t>& sizes, const std::vector<c10::ScalarType>& dtypes,
    const std::vector<c10::Device>& devices, const BucketCaps& caps, const std::vector<std::size_t>& order) {
  if (sizes.size() != dtypes.size() || sizes.size() != devices.size()) {
    throw InvalidArgument(str("compute_bucket_assignment: ", sizes.size(), " sizes, ", dtypes.size(),
                              " dtypes and ", devices.size(), " devices; they must be equal"));
  }
  if (caps.first_bucket_bytes == 0 || caps.bucket_bytes == 0) {
    throw InvalidArgument("compute_bucket_assignment: bucket caps must be positive");
  }
  const std::size_t n = sizes.size();
  // position[k]: when parameter k's gradient becomes ready (0 = first).
  std::vector<std::size_t> position(n, n);
  if (order.empty()) {
    for (std::size_t k = 0; k < n; ++k) position[k] = n - 1 - k;
  } else {
    if (order.size() != n) {
      throw InvalidArgument(str("compute_bucket_assignment: the ready order has ", order.size(),
                                " entries for ", n, " parameters; it must be a permutation of 0..", n, "-1"));
    }
    for (std::size_t pos = 0; pos < n; ++pos) {
      const std::size_t k = order[pos];
      if (k >= n || position[k] != n) {
        throw InvalidArgument(str("compute_bucket_assignment: the ready order is not a permutation of 0..", n,
                                  "-1 (entry ", pos, " is ", k, ")"));
      }
      position[k] = pos;
    }
  }
  std::vector<std::size_t> walk(n);
  for (std::size_t k = 0; k < n; ++k) walk[position[k]] = k;
  // One open bucket per (dtype, device); each key starts with the small first cap.
  using Key = std::tuple<int, int, int>;
  struct Open {
    std::vector<std::size_t> indices;
    std::size_t bytes = 0;
    bool closed_one = false;
  };
  std::map<Key, Open> open;
  std::vector<std::vector<std::size_t>> buckets;
  for (const std::size_t k : walk) {
    const Key key{static_cast<int>(dtypes[k]), static_cast<int>(devices[k].type()),
                  static_cast<int>(devices[k].index())};
    Open& bucket = open[key];
    bucket.indices.push_back(k);
    bucket.bytes += sizes[k];
    const std::size_t cap = bucket.closed_one ? caps.bucket_bytes : caps.first_bucket_bytes;
    if (bucket.bytes >= cap) {
      buckets.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.closed_one = true;
    }
  }
  for (auto& entry : open) {
    if (!entry.second.indices.empty()) buckets.push_back(std::move(entry.second.indices));
  }
  // Ready order: a bucket is ready when its last visited parameter is.
  std::stable_sort(buckets.begin(), buckets.end(), [&](const auto& a, const auto& b) {
    return position[a.back()] < position[b.back()];
  });
  return buckets;
}

}  // namespace ddp::detail
