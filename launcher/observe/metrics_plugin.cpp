// The metrics plugin: cpp-httplib serving GET /metrics (see launcher/observe/metrics_plugin_api.h), behind
// a gate that no slow or idle client can hold up (see Note [Metrics endpoint admission]).
#include <httplib.h>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "launcher/observe/metrics_plugin_api.h"

namespace {

using Clock = std::chrono::steady_clock;

// Note [Metrics endpoint admission]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cpp-httplib (0.11, Debian's) hands every accepted connection to a pool of 8 threads, first come
// first served, and each thread waits for its client: up to the keep-alive timeout for a first
// byte, and then up to the read timeout for *each* further byte. Eight clients sending a byte a
// second therefore hold every thread for as long as they like (no single read ever times out), and
// 200 idle connections queue up in front of a scrape for 200 / 8 keep-alive timeouts. Its settings
// alone cannot bound that, so the plugin takes the connections from httplib's accept loop (an
// inline task queue and an override of process_and_close_socket) and owns their I/O:
//   - one thread polls every connection without blocking on any of them and reads each request
//     header into a buffer (at most kMaxRequestBytes);
//   - per-connection timeouts are deadlines, not per-read waits: the whole request header must
//     arrive within kRequestTimeout of connecting, the whole response must leave within
//     kWriteTimeout of being ready; a connection that misses its deadline is closed;
//   - at most kMaxConnections are open at once; one more closes the oldest connection that is not
//     being answered (an idle or slow one, or one that was answered and lingers), so a crowd of
//     them cannot lock a scraper out, and a scraper (which sends its request at once) is answered
//     within milliseconds;
//   - a complete request goes through httplib's own parser and router (process_request) into a
//     buffer, which the poll thread sends without blocking. One request per connection
//     (Connection: close), as Prometheus' scrapes need nothing more.
// The listen backlog is raised to SOMAXCONN so that a burst of connections waits in the kernel
// instead of being refused.
constexpr std::chrono::milliseconds kRequestTimeout{2000};
constexpr std::chrono::milliseconds kWriteTimeout{2000};
constexpr std::size_t kMaxConnections = 256;
constexpr std::size_t kMaxRequestBytes = 8192;

void append(void* sink, const char* data, size_t len) { static_cast<std::string*>(sink)->append(data, len); }

// Runs each accepted connection's task at once on the accept thread: the task only hands the
// socket to the poll thread (see Note [Metrics endpoint admission]).
class InlineTaskQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> task) override { task(); }
  void shutdown() override {}
};

// A request already read, for httplib's parser; the response goes into `out`.
class BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(int fd, const std::string& request, std::string& out) : fd_(fd), request_(request), out_(out) {}

  bool is_readable() const override { return read_ < request_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - read_);
    std::memcpy(ptr, request_.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(::getsockname, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  void address_of(int (*query)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    char host[NI_MAXHOST] = {0};
    char service[NI_MAXSERV] = {0};
    if (query(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
        ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, service, sizeof service,
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      return;
    }
    ip = host;
    port = std::atoi(service);
  }

  int fd_;
  const std::string& request_;
  size_t read_ = 0;
  std::string& out_;
};

class GuardedServer final : public httplib::Server {
 public:
  GuardedServer() : wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    new_task_queue = [] { return new InlineTaskQueue; };
  }
  ~GuardedServer() override {
    stop_serving();
    for (int fd : arrived_) ::close(fd);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  // Binds and starts the accept and poll threads; false with a reason in error when it cannot.
  bool start_serving(const char* addr, int port, char* error, size_t error_len) {
    if (wake_fd_ < 0) {
      std::snprintf(error, error_len, "cannot serve --metrics_port: eventfd failed: %s", std::strerror(errno));
      return false;
    }
    if (!bind_to_port(addr, port)) {
      std::snprintf(error, error_len,
                    "cannot listen on %s:%d for --metrics_port (in use, or not an address of this machine)", addr, port);
      return false;
    }
    ::listen(svr_sock_, SOMAXCONN);  // see Note [Metrics endpoint admission]
    poller_ = std::thread([this] { poll_loop(); });
    acceptor_ = std::thread([this] { listen_after_bind(); });
    // stop() only stops a server that is running: wait (bounded) until it is.
    for (int i = 0; i < 2000 && !is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  }

  void stop_serving() {
    stop();
    if (acceptor_.joinable()) acceptor_.join();
    stopping_ = true;
    wake();
    if (poller_.joinable()) poller_.join();
  }

 private:
  enum class Phase {
    kReading,    // the request header, until kRequestTimeout
    kWriting,    // the response, until kWriteTimeout
    kLingering,  // response sent, our side shut: reading to the client's end (see close_gracefully)
  };
  struct Connection {
    int fd = -1;
    Phase phase = Phase::kReading;
    Clock::time_point deadline;
    std::string request;
    std::string response;
    size_t sent = 0;
  };

  // Called by httplib's accept loop for each connection (through InlineTaskQueue).
  bool process_and_close_socket(socket_t sock) override {
    {
      std::lock_guard<std::mutex> lock(arrived_mutex_);
      arrived_.push_back(sock);
    }
    wake();
    return true;
  }

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  static void close_connection(Connection& c) {
    ::shutdown(c.fd, SHUT_RDWR);
    ::close(c.fd);
    c.fd = -1;
  }

  void admit_arrived(Clock::time_point now) {
    std::vector<int> arrived;
    {
      std::lock_guard<std::mutex> lock(arrived_mutex_);
      arrived.swap(arrived_);
    }
    for (int fd : arrived) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      if (connections_.size() >= kMaxConnections) {
        // The oldest connection not being answered makes room (connections_ is oldest first).
        auto waiting = std::find_if(connections_.begin(), connections_.end(),
                                    [](const Connection& c) { return c.phase != Phase::kWriting; });
        if (waiting == connections_.end()) {
          ::close(fd);
          continue;
        }
        close_connection(*waiting);
        connections_.erase(waiting);
      }
      Connection c;
      c.fd = fd;
      c.deadline = now + kRequestTimeout;
      connections_.push_back(std::move(c));
    }
  }

  // Reads what the client sent; answers once the header is complete. False: close it.
  bool on_readable(Connection& c, Clock::time_point now) {
    char buf[4096];
    if (c.phase == Phase::kLingering) {
      while (true) {  // discards, until the client's end or nothing more for now
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0) return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      }
    }
    while (c.request.size() < kMaxRequestBytes) {
      const ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, kMaxRequestBytes - c.request.size()), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.request.append(buf, static_cast<size_t>(n));
      if (c.request.find("\r\n\r\n") != std::string::npos) {
        respond(c, now);
        return on_writable(c, now);
      }
    }
    // A header longer than any scrape's: say so, then close.
    c.response = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    c.phase = Phase::kWriting;
    c.deadline = now + kWriteTimeout;
    return on_writable(c, now);
  }

  void respond(Connection& c, Clock::time_point now) {
    BufferedStream stream(c.fd, c.request, c.response);
    bool closed = false;
    process_request(stream, /*close_connection=*/true, closed, nullptr);
    if (c.response.empty()) c.response = "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    c.phase = Phase::kWriting;
    c.deadline = now + kWriteTimeout;
  }

  // Sends what the socket takes now. False: failed, close it.
  static bool on_writable(Connection& c, Clock::time_point now) {
    while (c.sent < c.response.size()) {
      const ssize_t n = ::send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(n);
    }
    close_gracefully(c, now);
    return true;
  }

  // Closing a socket with unread input resets the connection, and a reset can discard the response
  // before the client read it (a request cut at kMaxRequestBytes always leaves input unread). So
  // our side is shut first and the rest is read and discarded until the client closes, for at most
  // kWriteTimeout; a lingering connection is the first to make room for a new one.
  static void close_gracefully(Connection& c, Clock::time_point now) {
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Phase::kLingering;
    c.deadline = now + kWriteTimeout;
  }

  void poll_loop() {
    std::vector<pollfd> fds;
    while (!stopping_) {
      auto now = Clock::now();
      auto next_deadline = now + std::chrono::seconds(1);
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (const auto& c : connections_) {
        fds.push_back({c.fd, static_cast<short>(c.phase == Phase::kWriting ? POLLOUT : POLLIN), 0});
        next_deadline = std::min(next_deadline, c.deadline);
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - now).count() + 1;
      if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, wait))) < 0 && errno != EINTR) break;
      now = Clock::now();
      size_t i = 1;
      for (auto it = connections_.begin(); it != connections_.end(); ++i) {
        Connection& c = *it;
        bool keep = true;
        if (fds[i].revents != 0) keep = c.phase == Phase::kWriting ? on_writable(c, now) : on_readable(c, now);
        if (keep && now >= c.deadline) keep = false;
        if (keep) {
          ++it;
        } else {
          close_connection(c);
          it = connections_.erase(it);
        }
      }
      if (fds[0].revents != 0) {
        std::uint64_t count = 0;
        [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &count, sizeof count);
        admit_arrived(now);
      }
    }
    for (auto& c : connections_) close_connection(c);
    connections_.clear();
  }

  int wake_fd_;
  std::atomic<bool> stopping_{false};
  std::mutex arrived_mutex_;
  std::vector<int> arrived_;          // accepted, not yet seen by the poll thread
  std::list<Connection> connections_;  // the poll thread's, oldest first
  std::thread acceptor_;
  std::thread poller_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void* ddp_metrics_start(const char* addr, int port,
                                                                           ddp_metrics_render_fn render,
                                                                           void* context, char* error,
                                                                           size_t error_len) {
  auto s = std::make_unique<GuardedServer>();
  for (const char* path : {"/metrics", "/healthz", "/readyz"}) {
    const bool metrics = std::string(path) == "/metrics";
    s->Get(path, [render, context, path, metrics](const httplib::Request&, httplib::Response& res) {
      std::string body;
      res.status = render(context, path, &body, append);
      res.set_content(body, metrics ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain; charset=utf-8");
    });
  }
  s->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ddp_launch: Prometheus metrics are at /metrics; probes at /healthz and /readyz\n", "text/plain");
  });
  if (!s->start_serving(addr, port, error, error_len)) return nullptr;
  return s.release();
}

extern "C" __attribute__((visibility("default"))) void ddp_metrics_stop(void* handle) {
  std::unique_ptr<GuardedServer> s(static_cast<GuardedServer*>(handle));
  s->stop_serving();
}
