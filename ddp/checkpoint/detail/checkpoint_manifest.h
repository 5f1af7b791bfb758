#pragma once
// The MANIFEST of a checkpoint folder and the checksums it holds (see Note [Checkpoint layout] in
// ddp/checkpoint/checkpoint.h, and see Note [MANIFEST format] below). Internal to the ddp library (and its tests
// and fuzzers).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ddp/base/detail/files.h"
#include "ddp/checkpoint/checkpoint.h"

namespace ddp::detail {

// Note [MANIFEST format]
// ~~~~~~~~~~~~~~~~~~~~~~
// Version 2, written today, is text:
//   ddp-checkpoint 2
//   epoch 3
//   step 1200
//   world_size 4
//   file model.pt 10245 1f0e6c4c2b5e1a77        (size in bytes, XXH3-64 of the file in hex)
//   file trainer.pt 2311 9a4c0d1e22f3b001
//   end 6 5d2e8c0f1a2b3c4d                      (lines above, XXH3-64 of every byte above)
// XXH3-64 (the xxHash library) detects truncated and corrupted files (PyTorch's zip reader does
// not check its CRCs) and can be checked outside C++: `xxhsum -H3 model.pt`, or Python's
// xxhash.xxh3_64(data).hexdigest(), prints the same hex digest; `head -n -1 MANIFEST | xxhsum -H3`
// the one of the end line. The end line makes a MANIFEST that was cut at any byte or edited
// invalid (a cut one used to verify while listing no file at all). Neither is a signature: anyone
// who can write the folder can recompute them; see Note [Checkpoint folder ownership] for that.
// Version 1 (ddp before this format) has no end line and the project's earlier 64-bit checksum
// (see Note [Legacy checksum]); such folders still verify and load.
inline constexpr const char* kManifestName = "MANIFEST";

enum class ChecksumKind { kXxh3, kLegacy };

// A streaming checksum of either kind; digest() may be called at any point.
class Checksum {
 public:
  explicit Checksum(ChecksumKind kind = ChecksumKind::kXxh3);
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A checksum as the MANIFEST, xxhsum and Python's hexdigest() write it: 16 lower-case hex digits.
std::string hex_digest(uint64_t checksum);

// The checksum of a whole byte string.
uint64_t checksum_of(const std::string& bytes, ChecksumKind kind = ChecksumKind::kXxh3);

struct FileDigest {
  uint64_t size = 0;
  uint64_t checksum = 0;
};

// The size and checksum of a file; throws IoError naming it.
FileDigest digest_file(const std::filesystem::path& path, ChecksumKind kind);

struct ManifestFile {
  std::string name;
  FileDigest digest;
};

struct Manifest {
  int version = 2;
  CheckpointInfo info;
  std::vector<ManifestFile> files;
  ChecksumKind checksum_kind() const { return version == 1 ? ChecksumKind::kLegacy : ChecksumKind::kXxh3; }
};

// The text of a MANIFEST. Version 1 (legacy, no end line) only for tests of old checkpoints.
std::string format_manifest(const CheckpointInfo& info, const std::vector<ManifestFile>& files, int version = 2);

// Parses a MANIFEST's text; `path` names it in errors. Throws IoError (one line) when it is
// malformed, cut, edited, or names a file outside its folder.
Manifest parse_manifest(const std::string& text, const std::filesystem::path& path);

// Reads <checkpoint>/MANIFEST (size-capped) and parses it; info.path is `checkpoint`.
Manifest read_manifest(const std::filesystem::path& checkpoint);

// A new file (created through ddp/base/detail/files.h: O_EXCL|O_NOFOLLOW, 0600) that counts and checksums
// (XXH3-64) what is written into it, and is fsynced on commit().
class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path path, mode_t mode = 0600);
  // A file created already (e.g. by create_temporary_sibling()); `path` names it in errors.
  OutputFile(std::filesystem::path path, FileDescriptor fd);
  void write(const void* data, size_t size);
  // fsync and close: after this the bytes are on disk.
  void commit();
  FileDigest digest() const { return {size_, checksum_.digest()}; }

 private:
  std::filesystem::path path_;
  FileDescriptor fd_;
  uint64_t size_ = 0;
  Checksum checksum_;
};

// rename(2); throws IoError naming both paths.
void rename_or_throw(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace ddp::detail
