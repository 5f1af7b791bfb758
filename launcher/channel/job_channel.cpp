#include "launcher/channel/job_channel.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"
#include "ddp/base/str.h"
#include "launcher/channel/job_coordinator.h"
#include "launcher/channel/job_link.h"
#include "launcher/process/net.h"

// Note [Coordinated restarts]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --max_restarts N a failure anywhere restarts the whole job, as torchrun does: every host
// stops its worker group and all start round k+1 together, each worker seeing
// TORCHELASTIC_RESTART_COUNT = k+1 (the same on every host: the round number, so N is the job's
// budget, not each node's). torchrun gets there through its rendezvous store (the failing agent
// re-enters the rendezvous; the others poll num_nodes_waiting() every --monitor_interval). Here:
// - One channel for both rendezvous kinds: node 0's launcher runs a coordinator (a thread, plain
//   TCP, no LibTorch: a static job must not load it, and the c10d plugin's store would mean a
//   second protocol) on the job's master address: on --master_port in a static job, on a port the
//   OS picked and published in the rendezvous store otherwise (See Note [One port per job] in
//   launcher/rendezvous/rendezvous.h). Every launcher, node 0's
//   included, connects to it as its workers start (never delaying them: the workers' own store is
//   the join barrier of each round; only a static job's launchers wait for the welcome, which names
//   the workers' store port) and says which host it is and which ranks it runs; the
//   coordinator sends that table to everyone, so every launcher can name any rank's host.
// - A group that fails tells the coordinator (`failed`), which tells every launcher (`stop`): the
//   others SIGTERM their groups at once instead of waiting for a collective to time out. Each
//   launcher, its group ended, reports the round's end (`ended ok|failed|final`) and waits for the
//   verdict: when every node has reported, `restart` if restarts are left and no node is lost or
//   final (signalled, or a worker it could not reap), else `done`. The round is the re-rendezvous:
//   node ranks and the master stay (membership is fixed; an elastic job, --nnodes MIN:MAX, runs a
//   channel per membership round and never restarts within it: See Note [Elastic rounds]).
// - A launcher whose connection closes without a goodbye is lost (killed, or its host is gone):
//   every other launcher is told its host and ranks (`lost`), stops, and the job ends, each summary
//   naming it. A node that does not report the end of a round within --rdzv_timeout of the round's
//   first failure (a partition: nothing closes) is named and the job ends. A launcher that loses
//   the coordinator itself (node 0 gone) stops and names node 0. With no restarts left a launcher
//   waits at most 2 s for the coordinator's word (its own failure relayed back, after any loss the
//   coordinator heard of first), so a partition never holds a failing launcher. A launcher slower
//   to start than node 0's whole job (it connects while the coordinator lingers) is waited for and
//   told the verdict `done` after its hello, so that the coordinator's going away is not node 0's loss.
// - Progress: with --hang_timeout, each launcher sends its ranks' last steps (at most every 200 ms,
//   only when they changed) and hears everyone else's, so a watchdog on any host names the ranks
//   of the job that did not arrive (those at the lowest step), whichever host runs them. With
//   --straggler_action, each also sends its ranks' step timings (`timings`, at most every 200 ms)
//   and hears everyone else's, so that any launcher can name the job's stragglers (See Note
//   [Stragglers] in launcher/observe/straggler.h).
// - Every wait is bounded: connecting and a round's verdict by --rdzv_timeout (2 s with nothing to
//   restart), the coordinator's linger at the end (it outlives node 0's group until the other
//   launchers have left, so that none mistakes node 0's normal exit for its loss) by --rdzv_timeout
//   after a success and 1 s after a failure (the others are stopping then, and have the verdict).
// - Trust: the channel is as open as the job's own TCPStore (which any client on the network can
//   write to): a launcher is recognised by its hello (a node rank not taken); anything else that is
//   not a launcher's line closes the connection.

namespace ddp::launcher::channel {

int start_connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) return -1;
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const bool failed = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) != 0 && errno != EINPROGRESS;
  ::freeaddrinfo(found);
  if (failed) ::close(fd);
  return failed ? -1 : fd;
}


LineConnection::~LineConnection() { close(); }

LineConnection::LineConnection(LineConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), in_(std::move(other.in_)), out_(std::move(other.out_)) {}

LineConnection& LineConnection::operator=(LineConnection&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    in_ = std::move(other.in_);
    out_ = std::move(other.out_);
  }
  return *this;
}

void LineConnection::send(const std::string& line) {
  if (fd_ < 0) return;
  out_ += line;
  out_ += '\n';
  flush();
}

bool LineConnection::flush() {
  if (fd_ < 0) return false;
  while (!out_.empty()) {
    const ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    out_.erase(0, static_cast<size_t>(n));
  }
  return true;
}

bool LineConnection::receive(const std::function<void(const std::string&)>& on_line) {
  if (fd_ < 0) return false;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    in_.append(buf, static_cast<size_t>(n));
    size_t begin = 0, end = 0;
    while ((end = in_.find('\n', begin)) != std::string::npos) {
      on_line(in_.substr(begin, end - begin));
      if (fd_ < 0) return false;  // closed by on_line
      begin = end + 1;
    }
    in_.erase(0, begin);
    if (in_.size() > 65536) return false;
  }
}

void LineConnection::say_goodbye() {
  send("bye");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (wants_write() && std::chrono::steady_clock::now() < until) {
    pollfd p{fd_, POLLOUT, 0};
    ::poll(&p, 1, 50);
    if (!flush()) break;
  }
}

void LineConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  out_.clear();
}

void end_thread(int (&wake)[2], std::thread& thread) {
  const char end = 'e';
  [[maybe_unused]] const ssize_t n = ::write(wake[1], &end, 1);
  if (thread.joinable()) thread.join();
  ::close(wake[0]);
  ::close(wake[1]);
}

std::string node_name(const std::string& host, int node, int first_rank, int nproc) {
  const std::string ranks =
      nproc == 1 ? ddp::str("rank ", first_rank) : ddp::str("ranks ", first_rank, "-", first_rank + nproc - 1);
  return ddp::str(host, " (node ", node, ", ", ranks, ")");
}

std::pair<std::string, std::string> split_word(const std::string& line) {
  const auto space = line.find(' ');
  if (space == std::string::npos) return {line, ""};
  return {line.substr(0, space), line.substr(space + 1)};
}

std::optional<int> parse_line_int(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string digits = negative ? text.substr(1) : text;
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return negative ? -std::stoi(digits) : std::stoi(digits);
}

JobChannel::JobChannel(std::unique_ptr<JobCoordinator> coordinator, std::unique_ptr<JobLink> link,
                       double success_linger_s, int store_port)
    : coordinator_(std::move(coordinator)),
      link_(std::move(link)),
      success_linger_s_(success_linger_s),
      store_port_(store_port) {}

int JobChannel::workers_store_port(double timeout_s) {
  if (store_port_ == 0) store_port_ = link_->wait_for_store_port(timeout_s);
  return store_port_;
}

JobChannel::~JobChannel() {
  link_.reset();  // goodbye first: node 0's own link must not count as lost
  if (coordinator_) coordinator_->set_linger(succeeded_ ? success_linger_s_ : 1);
  coordinator_.reset();
}

std::unique_ptr<JobChannel> open_job_channel(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node,
                                             int nproc_per_node, const std::string& host_name,
                                             rendezvous::EndpointDirectory* directory, const std::string& name) {
  if (node.nnodes <= 1) return nullptr;
  rendezvous::Endpoint coordinator_at{node.master_addr, node.master_port};
  std::unique_ptr<JobCoordinator> coordinator;
  int store_port = 0;
  if (node.node_rank == 0) {
    // Where the workers' store listens (See Note [Loopback store] in ddp/distributed/process_group.cpp).
    const std::string address = detail::store_listen_address(detail::look_up_route(node.master_addr), true);
    const int fd = detail::listen_on_address(address, directory != nullptr ? 0 : node.master_port);
    if (fd < 0) {
      throw UsageError(directory != nullptr
                           ? ddp::str("the launchers' job channel cannot listen on ", address, ": ", std::strerror(errno))
                           : ddp::str("port ", node.master_port, " on ", address, " (--master_port: node 0's launcher ",
                                      "listens there) cannot be bound: ", std::strerror(errno),
                                      "; pick another --master_port"));
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    JobCoordinatorOptions options;
    options.nnodes = node.nnodes;
    options.max_restarts = node.max_restarts;
    options.join_timeout_s = config.rdzv_timeout_s;
    if (directory != nullptr) {
      coordinator_at.port = process::bound_port(fd);
      directory->publish(name, coordinator_at);
    } else {
      store_port = options.store_port = process::pick_free_port(node.master_addr);
    }
    coordinator = std::make_unique<JobCoordinator>(fd, options);
  } else if (directory != nullptr) {
    coordinator_at = directory->lookup(name, config.rdzv_timeout_s);
  }
  JobLinkOptions options;
  options.coordinator_host = coordinator_at.addr;
  options.coordinator_port = coordinator_at.port;
  options.nnodes = node.nnodes;
  options.node_rank = node.node_rank;
  options.first_rank = node.node_rank * nproc_per_node;
  options.nproc = nproc_per_node;
  options.host_name = host_name;
  options.connect_timeout_s = config.rdzv_timeout_s;
  // A rendezvous store's job needs no port from the coordinator: its workers' store is the rank-0 node's.
  if (directory != nullptr) store_port = node.master_port;
  return std::make_unique<JobChannel>(std::move(coordinator), std::make_unique<JobLink>(std::move(options)),
                                      config.rdzv_timeout_s, store_port);
}

}  // namespace ddp::launcher::channel
