// Unit tests of what the rendezvous reads from and writes to the store (launcher/rendezvous/records.h):
// every value checked, claims and the master record proved with the job's token.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "launcher/rendezvous/records.h"

using namespace ddp::launcher::rendezvous;

TEST_CASE("rendezvous claims verify only for their job, slot, size and token", "[launcher][rdzv]") {
  const Token token("s3cret");
  const std::string nonce = random_nonce();
  CHECK(nonce.size() == 32);
  CHECK(random_nonce() != nonce);
  const std::string claim = make_claim(token, "job", 2, 1, nonce);
  CHECK(is_valid_claim(token, "job", 2, 1, claim));
  CHECK_FALSE(is_valid_claim(token, "job", 2, 0, claim));        // copied to another slot
  CHECK_FALSE(is_valid_claim(token, "job", 3, 1, claim));        // another job size
  CHECK_FALSE(is_valid_claim(token, "other", 2, 1, claim));      // another run id
  CHECK_FALSE(is_valid_claim(Token("guess"), "job", 2, 1, claim));  // another token
  CHECK_FALSE(is_valid_claim(Token(""), "job", 2, 1, claim));
  // What a foreign client might write.
  for (const std::string& junk : std::vector<std::string>{"", "abc", "1", "left", "claim", "claim 00 00", claim + " ", " " + claim,
                                 claim.substr(0, claim.size() - 1), std::string("\0\xff", 2)}) {
    INFO(printable_value(junk));
    CHECK_FALSE(is_valid_claim(token, "job", 2, 1, junk));
  }
  // Without a token the proofs still bind slot and job (a public key: see Note [Rendezvous token]).
  const Token none("");
  CHECK(is_valid_claim(none, "job", 2, 0, make_claim(none, "job", 2, 0, nonce)));
  CHECK_FALSE(is_valid_claim(none, "job", 2, 0, make_claim(token, "job", 2, 0, nonce)));
}

TEST_CASE("the master record: malformed or foreign values are one line naming the key and value",
          "[launcher][rdzv]") {
  const Token token("t");
  std::string error;
  const auto good = parse_master_record(token, "job7", make_master_record(token, "job7", {"10.0.0.5", 29501}), error);
  REQUIRE(good);
  CHECK(good->addr == "10.0.0.5");
  CHECK(good->port == 29501);
  CHECK(error.empty());

  struct Case {
    std::string value;
    std::string says;
  };
  const std::string proof = make_master_record(token, "job7", {"h", 1}).substr(std::string("master h 1 ").size());
  for (const Case& c : {Case{"abc", "not 'master <address> <port> <proof>'"},
                        Case{"master h abc " + proof, "the port 'abc' is not a number in 1..65535"},
                        Case{"master h 99999999999999999999 " + proof, "is not a number in 1..65535"},
                        Case{"master h 0 " + proof, "is not a number in 1..65535"},
                        Case{"master h -1 " + proof, "is not a number"},
                        Case{"master h 2 " + proof, "which no launcher of this job wrote"},
                        Case{std::string(500, 'x'), "..."}}) {
    INFO(c.value);
    error.clear();
    CHECK_FALSE(parse_master_record(token, "job7", c.value, error));
    CHECK_THAT(error, Catch::Contains("key 'ddp_rdzv/job7/master' holds '"));
    CHECK_THAT(error, Catch::Contains(c.says));
    CHECK(error.find('\n') == std::string::npos);
    CHECK(error.find("stoi") == std::string::npos);
    CHECK(error.size() < 300);
  }
  CHECK(printable_value(std::string("a\nb\0c", 5)) == "a\\x0ab\\x00c");
}
