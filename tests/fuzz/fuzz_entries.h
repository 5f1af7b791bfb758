#pragma once
// The entry points of the libFuzzer targets (tests/fuzz/fuzz_*_main.cpp) and of the regression test
// (test_fuzz_regressions.cpp), which feeds them the seed corpus and every file under
// tests/fuzz/regressions/<target>/ in the normal (gcc) build.
//
// Note [Fuzz inputs]
// ~~~~~~~~~~~~~~~~~~
// The first byte of an input chooses how the rest reaches the reader (a mode), the rest is the file's
// content: the readers take paths, so each input is written into a scratch folder (tmpfs when
// scripts/fuzz.sh runs them) and read through the same functions the programs call. An entry returns
// what became of the input: parsed, or rejected with a ddp::Error, whose message must be one
// non-empty line. Anything else is a bug: another exception escapes, a broken invariant of a parsed
// result throws std::logic_error (libFuzzer reports both as a crash through std::terminate), and
// memory errors are left to ASan.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ddp::fuzz {

struct Outcome {
  bool parsed = false;
  std::string error;  // ddp::Error's message when !parsed
};

// IDX (Fashion-MNIST). Modes (first byte & 1): 0 the file as given (plain, or gzip if it starts with
// the gzip magic), 1 the rest gzip-compressed first. Read with 1 and with 3 dimensions.
Outcome idx_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);

// CIFAR-10's binary version (test_batch.bin). Modes as for IDX.
Outcome cifar10_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);

// Checkpoints. Modes (first byte % 7): 0 the MANIFEST of a checkpoint whose model.pt and trainer.pt
// are valid; 1 a model.pt file as given; 2 the data.pkl pickle of a model.pt whose zip and storage
// records are valid; 3 a trainer.pt under a valid MANIFEST (checksums match) and model.pt; 4 the
// MANIFEST's lines, given a matching end line (its parser past the checksum); 5 and 6 the data.pkl
// pickle of a trainer.pt (progress, optimizer state, RNG), read into SGD with momentum / Adam.
Outcome checkpoint_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);

// What the launcher and a worker read from outside (fuzz_launcher.cpp, torch-free). hostfile: first
// byte % 3: 0 a hostfile, 1 a --hosts list, 2 a --hosts list, --include and --exclude, one a line.
// ddp_env: a .ddp_env file. rdzv_conf: a --rdzv_conf value. environment: NAME=VALUE lines, read by
// the launcher's flags and by a worker's contract. agent_datagram: one agent socket datagram.
// store_values: first byte % 5: a rendezvous master record, closed record, claim, member list, or a
// job channel number.
Outcome hostfile_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
Outcome ddp_env_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
Outcome rdzv_conf_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
Outcome environment_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
Outcome agent_datagram_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
Outcome store_values_entry(const uint8_t* data, size_t size, const std::filesystem::path& scratch);
void write_launcher_seeds(const std::filesystem::path& corpus);

// The names of the targets, which are also the folders of their corpora and regression inputs.
const std::vector<std::string>& target_names();
// Calls the entry of `target` (one of target_names()).
Outcome run_entry(const std::string& target, const std::vector<uint8_t>& input,
                  const std::filesystem::path& scratch);

// Seeds made from real data: small cuts of the Fashion-MNIST files in fashion_mnist_dir (plain and
// gzip), CIFAR-10 records, a real checkpoint of a small model. Writes <corpus>/<target>/<name>.
void write_seed_corpus(const std::filesystem::path& corpus, const std::string& fashion_mnist_dir);

// For the libFuzzer mains: a scratch folder of this process under $TMPDIR, removed at exit.
const std::filesystem::path& process_scratch();

// ---- Shared by the entries (fuzz_readers.cpp, fuzz_checkpoint.cpp, fuzz_registry.cpp) -------------

void write_file(const std::filesystem::path& file, const uint8_t* data, size_t size);
void write_gzip_file(const std::filesystem::path& file, const uint8_t* data, size_t size);
std::vector<uint8_t> read_file(const std::filesystem::path& file);
// Fails the input (std::logic_error) unless a ddp::Error's message is one non-empty line.
Outcome rejected(const std::exception& error);
void write_reader_seeds(const std::filesystem::path& corpus, const std::string& fashion_mnist_dir);
void write_checkpoint_seeds(const std::filesystem::path& corpus, const std::filesystem::path& scratch);

}  // namespace ddp::fuzz
