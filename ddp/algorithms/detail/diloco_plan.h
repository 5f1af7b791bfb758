#pragma once
// DiLoCo's pure parts: which parameters form each fragment, when a fragment is sent and applied,
// and the int8 codec of outer gradients. Tested on their own (tests/ddp/test_diloco.cpp).
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ddp::detail {

// The fragment of each parameter: F contiguous runs of the parameter list, cut where the running
// element count crosses k / F of the total, each run holding at least one parameter. Throws
// ddp::InvalidArgument when there are fewer parameters than fragments.
std::vector<int> diloco_fragments(const std::vector<std::int64_t>& numels, std::int64_t fragments);

// Fragment f's exchange starts after inner step s when s >= offset and (s - offset) % H == 0, with
// offset = floor(H (f + 1) / F); its outer step follows after inner step s + tau.
std::int64_t diloco_send_offset(std::int64_t sync_every, std::int64_t fragments, std::int64_t fragment);
bool diloco_sends_at(std::int64_t sync_every, std::int64_t fragments, std::int64_t fragment, std::int64_t step);

// The int8 payload of a float tensor: per block of `block` values, round(x / scale) with scale =
// max |x| / 127 of the block, then the blocks' float scales as bytes; numel + 4 ceil(numel / block)
// bytes. |x - decoded| <= scale / 2 for every value.
torch::Tensor encode_int8(const torch::Tensor& values, std::int64_t block);
// The mean over `ranks` payloads laid end to end (an all-gather's output) of `numel` values each.
torch::Tensor decode_int8_mean(const torch::Tensor& gathered, int ranks, std::int64_t numel, std::int64_t block);

}  // namespace ddp::detail
