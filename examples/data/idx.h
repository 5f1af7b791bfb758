#pragma once
// The IDX format of (Fashion-)MNIST: big-endian magic 0x0000 0x08 <rank>, then <rank> big-endian
// uint32 sizes, then the unsigned bytes. Files may be gzip-compressed or plain.
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::examples::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

// Reads a whole file, decompressing it when it starts with the gzip magic. Throws ddp::IoError
// naming the file when it is missing, unreadable or a corrupt gzip stream.
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

// Reads an IDX file of unsigned bytes with exactly `rank` dimensions. Throws ddp::IoError naming the
// file on a wrong magic number, a wrong rank or a size that does not match the header (truncated).
IdxArray read_idx(const std::string& path, int rank);

}  // namespace ddp::examples::data
