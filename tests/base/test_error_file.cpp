// The error file (ddp/base/detail/error_file.h): one atomic writer, one reader, and the reader's limits.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ddp/base/detail/error_file.h"
#include "ddp/base/detail/json_text.h"
#include "ddp/base/detail/report_files.h"
#include "tests/support/temp_dir.h"

using ddp::testing::TempDir;

TEST_CASE("the error file is written atomically and read back", "[error_file]") {
  TempDir dir;
  const std::string path = dir / ddp::detail::kErrorFileName;
  ddp::detail::WorkerError error;
  error.message = "bad \xff byte and \"quotes\"\n";
  error.callstack = "T: frame";
  error.timestamp = 1700000000;
  REQUIRE(ddp::detail::write_error_file(path, error));
  const auto back = ddp::detail::read_error_file(path);
  REQUIRE(back);
  CHECK(back->message == "bad \xef\xbf\xbd byte and \"quotes\"\n");  // not UTF-8: U+FFFD, still JSON
  CHECK(back->callstack == error.callstack);
  CHECK(back->timestamp == 1700000000);

  SECTION("a planted symlink is replaced, its target untouched") {
    const std::string victim = dir / "victim";
    std::ofstream(victim) << "precious";
    std::filesystem::remove(path);
    REQUIRE(::symlink(victim.c_str(), path.c_str()) == 0);
    REQUIRE(ddp::detail::write_error_file(path, error));
    std::ifstream in(victim);
    std::string text;
    std::getline(in, text);
    CHECK(text == "precious");
    CHECK(ddp::detail::read_error_file(path));
  }
  SECTION("an unwritable place is reported, not thrown") {
    CHECK_FALSE(ddp::detail::write_error_file("/proc/no/such/folder/error.json", error));
  }
}

TEST_CASE("the error file reader refuses what is not an error file", "[error_file]") {
  TempDir dir;
  CHECK_FALSE(ddp::detail::read_error_file(dir / "missing.json"));
  CHECK_FALSE(ddp::detail::read_error_file(dir.path.string()));  // a folder
  const std::string fifo = dir / "fifo.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(ddp::detail::read_error_file(fifo));  // answered at once: nobody writes to it
  const std::string huge = dir / "huge.json";
  {
    std::ofstream out(huge);
    out << R"({"message": ")" << std::string(ddp::detail::kMaxErrorFileBytes, 'x') << R"("})";
  }
  CHECK_FALSE(ddp::detail::read_error_file(huge));
  // Deep nesting is parsed without recursion; it is simply not an error file.
  CHECK_FALSE(ddp::detail::parse_error_json(std::string(100000, '[') + std::string(100000, ']')));
  CHECK_FALSE(ddp::detail::parse_error_json(R"({"message": {"message": "m", "extraInfo": {"timestamp": 1e300}}})")->timestamp);
}

TEST_CASE("JSON values come out as nlohmann-json reads them", "[json]") {
  for (const std::string& text : {std::string("plain"), std::string("tab\t\"q\" \\ \x01 \xc3\xa9"), std::string()}) {
    CHECK(nlohmann::json::parse(ddp::detail::json_string(text)) == text);
  }
  CHECK(ddp::detail::json_string("a\nb\\c\x01") == R"("a\nb\\c\u0001")");
  CHECK(ddp::detail::json_number(0.9) == "0.9");
  CHECK(ddp::detail::json_number(2.25) == "2.25");
  CHECK(ddp::detail::json_number(1.0 / 0.0) == "null");
  CHECK(ddp::detail::json_number(std::nan("")) == "null");
}
