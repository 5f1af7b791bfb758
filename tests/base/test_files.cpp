// ddp/base/detail/files.h: see Note [Creating files in shared folders]. A planted symlink is never
// followed, an existing name is refused, an atomic replace leaves the old or the new content, private
// folders are 0700 and new each time, read_file refuses what it must not read.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "ddp/base/error.h"
#include "ddp/base/detail/files.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using ddp::testing::TempDir;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void put(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

mode_t mode_of(const std::string& path) {
  struct stat info {};
  REQUIRE(::lstat(path.c_str(), &info) == 0);
  return info.st_mode;
}

// The names in a folder (temporaries included).
std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// Another user's file `victim` in dir, and a symlink `name` to it planted where the job will write.
struct PlantedLink {
  std::string victim;
  std::string link;
};
PlantedLink plant_link(const TempDir& dir, const std::string& name) {
  PlantedLink planted{dir / "victim", dir / name};
  put(planted.victim, "precious");
  REQUIRE(::symlink(planted.victim.c_str(), planted.link.c_str()) == 0);
  return planted;
}

}  // namespace

TEST_CASE("create_new_file never follows a planted symlink and refuses an existing name", "[files]") {
  TempDir dir;
  const auto [victim, link] = plant_link(dir, "report.json");

  CHECK_THROWS_AS(ddp::detail::create_new_file(link), ddp::IoError);
  CHECK(slurp(victim) == "precious");
  CHECK(fs::is_symlink(link));

  SECTION("a dangling link is not followed either (it would create the target)") {
    const std::string dangling = dir / "dangling";
    REQUIRE(::symlink((dir / "created-through-link").c_str(), dangling.c_str()) == 0);
    CHECK_THROWS_AS(ddp::detail::create_new_file(dangling), ddp::IoError);
    CHECK_FALSE(fs::exists(dir / "created-through-link"));
  }
  SECTION("an existing regular file is refused with a message that says so") {
    const std::string taken = dir / "taken";
    put(taken, "old");
    CHECK_THROWS_WITH(ddp::detail::create_new_file(taken), Contains(taken) && Contains("already there"));
    CHECK(slurp(taken) == "old");
  }
  SECTION("a new name is created with the mode asked for, for writing") {
    const std::string fresh = dir / "fresh";
    {
      ddp::detail::FileDescriptor fd = ddp::detail::create_new_file(fresh, 0600);
      REQUIRE(fd.valid());
      ddp::detail::write_all(fd.get(), "abc", 3, fresh);
    }
    CHECK(slurp(fresh) == "abc");
    CHECK((mode_of(fresh) & 0777) == 0600);
  }
}

TEST_CASE("write_file_atomically replaces a planted symlink, never what it points to", "[files]") {
  TempDir dir;
  const auto [victim, link] = plant_link(dir, "error.json");

  ddp::detail::write_file_atomically(link, "new contents");
  CHECK(slurp(victim) == "precious");
  CHECK_FALSE(fs::is_symlink(link));
  CHECK(fs::is_regular_file(link));
  CHECK(slurp(link) == "new contents");
  CHECK(names_in(dir.path.string()) == std::set<std::string>{"error.json", "victim"});  // no temporary left
}

TEST_CASE("write_file_atomically: readers see the old or the new file, never a part", "[files]") {
  TempDir dir;
  const std::string path = dir / "state";
  // Two contents of different sizes: a torn or truncated read would be neither.
  const std::string small(10, 'a');
  const std::string large(256 * 1024, 'b');
  ddp::detail::write_file_atomically(path, small);

  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) ddp::detail::write_file_atomically(path, i % 2 == 0 ? large : small);
  });
  int reads = 0;
  int torn = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    const std::string seen = ddp::detail::read_file(path, large.size());
    if (seen != small && seen != large) ++torn;
    ++reads;
  }
  stop = true;
  writer.join();
  INFO(reads << " reads");
  CHECK(reads > 10);
  CHECK(torn == 0);
  CHECK(names_in(dir.path.string()) == std::set<std::string>{"state"});

  SECTION("a write that fails leaves the old content and no temporary") {
    const std::string before = slurp(path);
    REQUIRE(::chmod(dir.path.c_str(), 0500) == 0);
    const bool writable_anyway = ::access(dir.path.c_str(), W_OK) == 0;  // root ignores the mode
    if (!writable_anyway) {
      CHECK_THROWS_AS(ddp::detail::write_file_atomically(path, "other"), ddp::IoError);
      CHECK_FALSE(ddp::detail::try_write_file_atomically(path, "other"));
    }
    REQUIRE(::chmod(dir.path.c_str(), 0700) == 0);
    CHECK(slurp(path) == before);
    CHECK(names_in(dir.path.string()) == std::set<std::string>{"state"});
  }
  SECTION("durable writes end the same way") {
    ddp::detail::write_file_atomically(path, "durable", 0600, /*durable=*/true);
    CHECK(slurp(path) == "durable");
  }
}

TEST_CASE("make_private_dir makes a new 0700 folder each time", "[files]") {
  TempDir dir;
  const std::string parent = dir / "missing/parent";
  REQUIRE(::mkdir((dir / "missing").c_str(), 0755) == 0);
  const std::string first = ddp::detail::make_private_dir(parent, "run_");
  const std::string second = ddp::detail::make_private_dir(parent, "run_");
  CHECK(first != second);
  for (const auto& made : {first, second}) {
    INFO(made);
    CHECK(made.rfind(parent + "/run_", 0) == 0);
    CHECK(fs::is_directory(made));
    CHECK((mode_of(made) & 0777) == 0700);
  }
  CHECK((mode_of(parent) & 0777) == 0700);  // the missing parent was made private too
  CHECK_THROWS_AS(ddp::detail::make_private_dir("/proc/no/such/folder", "run_"), ddp::IoError);
}

TEST_CASE("read_file reads a regular file within its cap and refuses anything else", "[files]") {
  TempDir dir;
  const std::string path = dir / "data";
  put(path, std::string(100, 'x'));
  CHECK(ddp::detail::read_file(path, 100) == std::string(100, 'x'));
  CHECK_THROWS_WITH(ddp::detail::read_file(path, 99), Contains(path) && Contains("more than the 99"));
  CHECK_THROWS_WITH(ddp::detail::read_file(dir.path.string(), 1000), Contains("not a regular file"));
  CHECK_THROWS_WITH(ddp::detail::read_file("/dev/zero", 1000), Contains("not a regular file"));
  CHECK_THROWS_AS(ddp::detail::read_file(dir / "missing", 1000), ddp::IoError);

  SECTION("a FIFO is refused at once, not waited on (nobody writes to it)") {
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto reading = std::async(std::launch::async, [&] {
      try {
        ddp::detail::read_file(fifo, 1000);
        return std::string("read it");
      } catch (const ddp::IoError& error) {
        return std::string(error.what());
      }
    });
    if (reading.wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
      const int unblock = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the stuck open return
      reading.wait();
      if (unblock >= 0) ::close(unblock);
      FAIL("read_file waited on a FIFO");
    }
    CHECK_THAT(reading.get(), Contains("not a regular file"));
  }
}
