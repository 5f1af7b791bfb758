#include "ddp/checkpoint/detail/checkpoint_manifest.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/base/str.h"

namespace ddp::detail {
namespace fs = std::filesystem;

namespace {

constexpr const char* kHeaderV1 = "ddp-checkpoint 1";
constexpr const char* kHeaderV2 = "ddp-checkpoint 2";
// A MANIFEST lists a handful of files; anything much larger is not one.
constexpr size_t kMaxManifestBytes = 1 << 20;

// Note [Legacy checksum]
// ~~~~~~~~~~~~~~~~~~~~~~
// The checksum of version-1 MANIFESTs, kept so that their checkpoints still verify. Each 8-byte
// word goes through h = mix(h ^ word), mix being a bijection, so a change confined to one word
// always changes the digest; the length is mixed in at the end. Not cryptographic.
class LegacyChecksum {
 public:
  void update(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    length_ += size;
    while (size > 0 && pending_size_ > 0) {
      pending_[pending_size_++] = *bytes++;
      --size;
      if (pending_size_ == 8) {
        mix(load(pending_));
        pending_size_ = 0;
      }
    }
    for (; size >= 8; bytes += 8, size -= 8) mix(load(bytes));
    for (; size > 0; --size) pending_[pending_size_++] = *bytes++;
  }

  uint64_t digest() const {
    LegacyChecksum copy = *this;
    unsigned char tail[8] = {};
    std::memcpy(tail, copy.pending_, copy.pending_size_);
    copy.mix(load(tail));
    copy.mix(copy.length_);
    return copy.hash_;
  }

 private:
  static uint64_t load(const unsigned char* bytes) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    return word;
  }
  void mix(uint64_t word) {
    hash_ = (hash_ ^ word) * 0x9E3779B97F4A7C15ull;
    hash_ ^= hash_ >> 32;
  }

  uint64_t hash_ = 0xcbf29ce484222325ull;
  uint64_t length_ = 0;
  unsigned char pending_[8] = {};
  size_t pending_size_ = 0;
};

// Digits only: istream's >> into an unsigned type takes "-1" and wraps it around.
bool parse_size(const std::string& text, uint64_t& value) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) return false;
  value = std::stoull(text);
  return true;
}

bool parse_hex(const std::string& text, uint64_t& value) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  value = std::stoull(text, nullptr, 16);
  return true;
}

// Checks a version-2 MANIFEST's end line and returns the text above it.
std::string check_end_line(const std::string& text, const fs::path& path) {
  const auto invalid = [&path](const std::string& why) {
    return IoError(str(path.string(), ": ", why, ": the MANIFEST was cut or edited"));
  };
  if (text.empty() || text.back() != '\n') throw invalid("it does not end with a newline");
  const auto start = text.rfind('\n', text.size() - 2);
  const std::string body = text.substr(0, start + 1);
  std::istringstream fields(text.substr(start + 1));
  std::string key, count, digest, extra;
  uint64_t lines = 0;
  uint64_t checksum = 0;
  if (!(fields >> key >> count >> digest) || key != "end" || (fields >> extra) || !parse_size(count, lines) ||
      !parse_hex(digest, checksum)) {
    throw invalid("its last line is not 'end <lines> <xxh3>'");
  }
  const auto counted = static_cast<size_t>(std::count(body.begin(), body.end(), '\n'));
  if (counted != lines) throw invalid(str("the end line counts ", lines, " lines above it, there are ", counted));
  if (checksum_of(body) != checksum) throw invalid("the checksum of its end line does not match");
  return body;
}

}  // namespace

std::string hex_digest(uint64_t checksum) {
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016" PRIx64, checksum);
  return digits;
}

struct Checksum::State {
  XXH3_state_t* xxh3 = nullptr;  // null: the legacy kind
  LegacyChecksum legacy;
};

Checksum::Checksum(ChecksumKind kind) : state_(std::make_unique<State>()) {
  if (kind == ChecksumKind::kXxh3) {
    state_->xxh3 = XXH3_createState();
    if (state_->xxh3 == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_->xxh3);
  }
}

Checksum::~Checksum() {
  if (state_->xxh3 != nullptr) XXH3_freeState(state_->xxh3);
}

void Checksum::update(const void* data, size_t size) {
  if (state_->xxh3 != nullptr) {
    XXH3_64bits_update(state_->xxh3, data, size);
  } else {
    state_->legacy.update(data, size);
  }
}

uint64_t Checksum::digest() const {
  return state_->xxh3 != nullptr ? XXH3_64bits_digest(state_->xxh3) : state_->legacy.digest();
}

uint64_t checksum_of(const std::string& bytes, ChecksumKind kind) {
  Checksum checksum(kind);
  checksum.update(bytes.data(), bytes.size());
  return checksum.digest();
}

FileDigest digest_file(const fs::path& path, ChecksumKind kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str(path.string(), ": cannot open: ", std::strerror(errno)));
  Checksum checksum(kind);
  FileDigest result;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    checksum.update(buffer.data(), got);
    result.size += got;
  }
  if (in.bad()) throw IoError(str(path.string(), ": read error: ", std::strerror(errno)));
  result.checksum = checksum.digest();
  return result;
}

std::string format_manifest(const CheckpointInfo& info, const std::vector<ManifestFile>& files, int version) {
  DDP_CHECK(version == 1 || version == 2, "MANIFEST versions are 1 and 2");
  std::ostringstream out;
  out << (version == 1 ? kHeaderV1 : kHeaderV2) << "\nepoch " << info.epoch << "\nstep " << info.step
      << "\nworld_size " << info.world_size << "\n";
  for (const auto& file : files) {
    out << "file " << file.name << " " << file.digest.size << " " << hex_digest(file.digest.checksum) << "\n";
  }
  std::string text = out.str();
  if (version == 2) {
    const size_t lines = 4 + files.size();
    text += str("end ", lines, " ", hex_digest(checksum_of(text)), "\n");
  }
  return text;
}

Manifest parse_manifest(const std::string& text, const fs::path& path) {
  Manifest manifest;
  const auto newline = text.find('\n');
  const std::string header = text.substr(0, newline);
  if (header == kHeaderV1) {
    manifest.version = 1;
  } else if (header != kHeaderV2) {
    throw IoError(str(path.string(), ": first line is not '", kHeaderV2, "': corrupt or not a checkpoint"));
  }
  const std::string body = manifest.version == 2 ? check_end_line(text, path) : text;
  std::istringstream in(body);
  std::string line;
  std::getline(in, line);
  for (int number = 2; std::getline(in, line); ++number) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    bool ok = true;
    if (key == "epoch") {
      ok = static_cast<bool>(fields >> manifest.info.epoch);
    } else if (key == "step") {
      ok = static_cast<bool>(fields >> manifest.info.step);
    } else if (key == "world_size") {
      ok = static_cast<bool>(fields >> manifest.info.world_size);
    } else if (key == "file") {
      ManifestFile file;
      std::string size, checksum;
      ok = static_cast<bool>(fields >> file.name >> size >> checksum) && parse_size(size, file.digest.size) &&
           parse_hex(checksum, file.digest.checksum);
      // Names are files in the checkpoint folder: "../x" or "/x" would read files elsewhere.
      if (ok && (file.name.find('/') != std::string::npos || file.name == "." || file.name == "..")) {
        throw IoError(str(path.string(), ": line ", number, ": '", file.name,
                          "' is not a plain file name: corrupt MANIFEST"));
      }
      manifest.files.push_back(file);
    }
    if (!ok) throw IoError(str(path.string(), ": line ", number, " is malformed: '", line, "'"));
  }
  return manifest;
}

Manifest read_manifest(const fs::path& checkpoint) {
  const fs::path path = checkpoint / kManifestName;
  std::error_code error;
  const auto status = fs::symlink_status(path, error);
  if (!fs::exists(status)) throw IoError(str(path.string(), ": missing: the checkpoint is incomplete"));
  // Opening a FIFO would block, a symlink could point anywhere (a planted folder holds either).
  if (!fs::is_regular_file(status)) throw IoError(str(path.string(), ": not a regular file: refused"));
  Manifest manifest = parse_manifest(read_file(path.string(), kMaxManifestBytes), path);
  manifest.info.path = checkpoint;
  return manifest;
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw IoError(str("cannot rename ", from.string(), " to ", to.string(), ": ", std::strerror(errno)));
  }
}

OutputFile::OutputFile(fs::path path, mode_t mode)
    : path_(std::move(path)), fd_(create_new_file(path_.string(), mode)) {}

OutputFile::OutputFile(fs::path path, FileDescriptor fd) : path_(std::move(path)), fd_(std::move(fd)) {}

void OutputFile::write(const void* data, size_t size) {
  checksum_.update(data, size);
  size_ += size;
  write_all(fd_.get(), data, size, path_.string());
}

void OutputFile::commit() {
  if (::fsync(fd_.get()) != 0) throw IoError(str("cannot fsync ", path_.string(), ": ", std::strerror(errno)));
  const int fd = fd_.release();
  if (::close(fd) != 0) throw IoError(str("cannot close ", path_.string(), ": ", std::strerror(errno)));
}

}  // namespace ddp::detail
