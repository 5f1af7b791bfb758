#pragma once
// Slurm host-list syntax: "ns[3182447,3185995,3186000-3186002]", "node[001-003]", "a[1-2],b3",
// "rack[1-2]-n[01-02]" (several bracket groups expand as a cartesian product, left to right).
#include <string>
#include <vector>

namespace ddp::detail {

// Expands a host list; throws UsageError on malformed input (unbalanced brackets, bad ranges).
std::vector<std::string> expand_hostlist(const std::string& text);

}  // namespace ddp::detail
