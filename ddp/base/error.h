#pragma once
// The project's small exception hierarchy and check macros (in gloo's manner: a failed comparison
// prints both values). Header-only and free of LibTorch, so the launcher can use it too.
#include <stdexcept>
#include <string>

#include "ddp/base/str.h"

namespace ddp {

// Base of every error this project throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something wrong: a flag, an option, a file, a variable.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran past its timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A store or collective operation failed (peer gone, connection refused, ...).
class CommunicationError : public Error {
 public:
  using Error::Error;
};

// A collective failed because a peer is gone: its connection was closed or reset, or the group was
// aborted (ProcessGroup::abort). The one error a training loop may recover from by rebuilding the
// group with the ranks that are left (See Note [Live recovery] in ddp/elastic/fault_tolerant.h). A collective
// that times out stays a TimeoutError; recovery treats it as a lost peer too.
class PeerLostError : public CommunicationError {
 public:
  using CommunicationError::CommunicationError;
};

// Ranks disagree about something that must be identical on all of them (model, world size).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// Bad input on a command line or in the environment (a tool's flags, a launcher's variables):
// the program prints it as one line on stderr and exits with kUsageExitCode before it starts work.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

constexpr int kUsageExitCode = 2;

// A file could not be read or written, or its contents are not what they should be.
class IoError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] inline void throw_check_failure(const char* file, int line, const std::string& what,
                                             const std::string& context) {
  throw Error(str(what, context.empty() ? "" : ": ", context, " (", file, ":", line, ")"));
}
}  // namespace detail

}  // namespace ddp

// DDP_CHECK(cond, message parts...) throws ddp::Error naming the condition and the message.
#define DDP_CHECK(cond, ...)                                                                    \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      ::ddp::detail::throw_check_failure(__FILE__, __LINE__, "check failed: " #cond,            \
                                         ::ddp::str(__VA_ARGS__));            \
    }                                                                                           \
  } while (false)

#define DDP_CHECK_OP_(a, b, op, ...)                                                            \
  do {                                                                                          \
    const auto& ddp_check_a_ = (a);                                                             \
    const auto& ddp_check_b_ = (b);                                                             \
    if (!(ddp_check_a_ op ddp_check_b_)) {                                                      \
      ::ddp::detail::throw_check_failure(                                                       \
          __FILE__, __LINE__,                                                                   \
          ::ddp::str("check failed: " #a " " #op " " #b " (", ddp_check_a_, " vs. ", ddp_check_b_, \
                     ")"),                                                                      \
          ::ddp::str(__VA_ARGS__));                                           \
    }                                                                                           \
  } while (false)

#define DDP_CHECK_EQ(a, b, ...) DDP_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define DDP_CHECK_NE(a, b, ...) DDP_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define DDP_CHECK_LT(a, b, ...) DDP_CHECK_OP_(a, b, <, __VA_ARGS__)
#define DDP_CHECK_LE(a, b, ...) DDP_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define DDP_CHECK_GT(a, b, ...) DDP_CHECK_OP_(a, b, >, __VA_ARGS__)
#define DDP_CHECK_GE(a, b, ...) DDP_CHECK_OP_(a, b, >=, __VA_ARGS__)
