#include "examples/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "ddp/base/error.h"

namespace ddp::examples::data {
namespace {

constexpr uint8_t kGzipMagic0 = 0x1f;
constexpr uint8_t kGzipMagic1 = 0x8b;
constexpr uint8_t kIdxUnsignedByte = 0x08;

std::vector<uint8_t> gunzip(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw IoError(str(path, ": cannot open: ", std::strerror(errno)));
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    const int n = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      throw IoError(str(path, ": corrupt gzip data (", message, "): download the file again"));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  // gzread returns 0 at a premature end as well; gzclose reports it as Z_BUF_ERROR.
  if (gzclose(file) != Z_OK) {
    throw IoError(str(path, ": truncated gzip stream: download the file again"));
  }
  return out;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str(path, ": cannot open: ", std::strerror(errno)));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(str(path, ": read error"));
  if (bytes.size() >= 2 && bytes[0] == kGzipMagic0 && bytes[1] == kGzipMagic1) return gunzip(path);
  return bytes;
}

IdxArray read_idx(const std::string& path, int rank) {
  std::vector<uint8_t> bytes = read_maybe_gzip(path);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() < 4) throw IoError(str(path, ": truncated: ", bytes.size(), " bytes, no IDX header"));
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != kIdxUnsignedByte || bytes[3] != rank) {
    char magic[16];
    std::snprintf(magic, sizeof magic, "0x%08x", big_endian_u32(bytes.data()));
    char expected[16];
    std::snprintf(expected, sizeof expected, "0x%08x", 0x800u | static_cast<unsigned>(rank));
    throw IoError(str(path, ": wrong magic number ", magic, " (expected ", expected,
                      ": an IDX file of unsigned bytes with ", rank, " dimensions)"));
  }
  if (bytes.size() < header) {
    throw IoError(str(path, ": truncated: ", bytes.size(), " bytes, the IDX header needs ", header));
  }
  IdxArray array;
  size_t expected = 1;
  bool overflow = false;  // dimensions whose product does not fit in size_t (a corrupt header)
  for (int d = 0; d < rank; ++d) {
    const uint32_t size = big_endian_u32(bytes.data() + 4 + 4 * d);
    array.dims.push_back(size);
    overflow = overflow || __builtin_mul_overflow(expected, size_t{size}, &expected);
  }
  const size_t payload = bytes.size() - header;
  if (overflow) {
    throw IoError(str(path, ": truncated or corrupt: the header promises ", join(array.dims, " x "),
                      " data bytes, more than any file holds; the file holds ", payload));
  }
  if (payload != expected) {
    throw IoError(str(path, ": ", payload < expected ? "truncated" : "too long", ": the header promises ",
                      expected, " data bytes, the file holds ", payload));
  }
  array.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

}  // namespace ddp::examples::data
