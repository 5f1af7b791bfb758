#include "launcher/channel/job_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <spdlog/spdlog.h>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "launcher/process/spawn.h"
#include "launcher/process/worker_process.h"

namespace ddp::launcher::channel {

JobLink::JobLink(JobLinkOptions options)
    : options_(std::move(options)), started_(Clock::now()), next_try_(Clock::now()) {
  try_connect();
}

JobLink::~JobLink() {
  if (link_.is_open() && !connecting_) link_.say_goodbye();
}

int JobLink::poll_fd() const { return link_.fd(); }

short JobLink::poll_events() const {
  if (!link_.is_open()) return 0;
  return static_cast<short>(connecting_ || link_.wants_write() ? POLLOUT | POLLIN : POLLIN);
}

void JobLink::try_connect() {
  if (link_.is_open() || coordinator_gone_ || Clock::now() < next_try_) return;
  next_try_ = Clock::now() + std::chrono::milliseconds(100);
  const int fd = start_connect(options_.coordinator_host, options_.coordinator_port);
  if (fd < 0) return;
  link_ = LineConnection(fd);
  connecting_ = true;
}

void JobLink::pump() {
  try_connect();
  if (!link_.is_open()) return;
  if (connecting_) {
    pollfd p{link_.fd(), POLLOUT, 0};
    if (::poll(&p, 1, 0) <= 0) return;
    int error = 0;
    socklen_t len = sizeof error;
    ::getsockopt(link_.fd(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {  // not listening yet: try again
      link_.close();
      connecting_ = false;
      return;
    }
    connecting_ = false;
    hello_sent_ = true;
    link_.send(ddp::str("hello ", options_.node_rank, " ", options_.first_rank, " ", options_.nproc, " ",
                        options_.host_name));
  }
  // A ping at least every 250 ms: the coordinator can tell a silent node (See Note [Coordinated restarts]).
  if (!link_.wants_write() && Clock::now() - last_ping_ >= std::chrono::milliseconds(250)) {
    link_.send("ping");
    last_ping_ = Clock::now();
  }
  if (!link_.flush() || !link_.receive([this](const std::string& line) { on_line(line); })) connection_lost();
}

void JobLink::connection_lost() {
  link_.close();
  if (!hello_sent_ || coordinator_gone_) return;
  // After its verdict "done" the coordinator goes away with node 0's launcher: not a loss.
  for (const auto& [round, kind] : verdicts_) {
    if (kind == "done") return;
  }
  coordinator_gone_ = true;
  lost_[0] = true;
  const std::string what = ddp::str(name_of_node(0), " was lost: the job's coordinator, in its launcher, closed the ",
                                     "connection (the launcher or its host is gone)");
  add_news(what);
  if (!job_stop_) job_stop_ = what;
}

void JobLink::add_news(const std::string& line) {
  if (std::find(news_.begin(), news_.end(), line) == news_.end()) news_.push_back(line);
}

void JobLink::on_line(const std::string& line) {
  const auto [word, rest] = split_word(line);
  if (word == "node") {  // node K FIRST NPROC HOST
    const auto [k, r1] = split_word(rest);
    const auto [first, r2] = split_word(r1);
    const auto [nproc, host] = split_word(r2);
    const auto node = parse_line_int(k), f = parse_line_int(first), n = parse_line_int(nproc);
    if (node && f && n) nodes_[*node] = {*f, *n, host};
  } else if (word == "stop") {  // stop ROUND NODE TEXT
    const auto [round, r1] = split_word(rest);
    const auto [node, what] = split_word(r1);
    const auto r = parse_line_int(round);
    if (r && parse_line_int(node) != options_.node_rank) stops_.emplace(*r, what);
    if (r && parse_line_int(node) == options_.node_rank) stops_.emplace(*r, "");  // our own failure, acknowledged
  } else if (word == "lost") {  // lost NODE TEXT
    const auto [node, what] = split_word(rest);
    add_news(what);
    if (const auto k = parse_line_int(node)) lost_[*k] = true;
    if (!job_stop_) job_stop_ = what;
  } else if (word == "progress") {  // progress NODE ROUND RANK:STEP,...
    const auto [node, r1] = split_word(rest);
    const auto [round, list] = split_word(r1);
    const auto r = parse_line_int(round);
    if (!r) return;
    if (*r != remote_steps_round_) {
      remote_steps_.clear();
      remote_steps_round_ = *r;
    }
    for (const std::string& item : config::split_list(list, ',')) {
      const auto colon = item.find(':');
      const auto rank = colon == std::string::npos ? std::nullopt : parse_line_int(item.substr(0, colon));
      try {
        if (rank) remote_steps_[*rank] = std::stoll(item.substr(colon + 1));
      } catch (const std::exception&) {
      }
    }
  } else if (word == "timings") {  // timings NODE ROUND ITEMS
    const auto [node, r1] = split_word(rest);
    const auto [round, items] = split_word(r1);
    const auto r = parse_line_int(round);
    if (r && remote_timings_.size() < 1024) remote_timings_.emplace_back(*r, items);  // bounded if never taken
  } else if (word == "store") {  // store PORT
    if (const auto port = parse_line_int(rest); port && *port > 0 && *port <= 65535) store_port_ = *port;
  } else if (word == "verdict") {  // verdict ROUND restart|done
    const auto [round, kind] = split_word(rest);
    if (const auto r = parse_line_int(round)) verdicts_[*r] = kind;
  } else if (word == "note") {
    spdlog::error("{}", rest);
    add_news(rest);
  }
}

std::optional<std::string> JobLink::take_stop(int round) {
  if (stop_taken_[round]) return std::nullopt;
  const auto it = stops_.find(round);
  const auto stop = it != stops_.end() && !it->second.empty() ? std::optional<std::string>(it->second) : job_stop_;
  if (stop) stop_taken_[round] = true;
  return stop;
}

void JobLink::report_failure(int round, const std::string& what) {
  if (failure_reported_[round]) return;
  failure_reported_[round] = true;
  if (link_.is_open() && !connecting_) link_.send(ddp::str("failed ", round, " ", what));
}

void JobLink::publish_progress(int round, const std::vector<std::pair<int, std::int64_t>>& steps) {
  if (steps.empty() || steps == sent_steps_ || !link_.is_open() || connecting_) return;
  if (Clock::now() - last_progress_sent_ < std::chrono::milliseconds(200)) return;
  std::vector<std::string> items;
  for (const auto& [rank, step] : steps) items.push_back(ddp::str(rank, ":", step));
  link_.send(ddp::str("progress ", round, " ", ddp::join(items, ",")));
  sent_steps_ = steps;
  last_progress_sent_ = Clock::now();
}

void JobLink::publish_timings(int round, const std::string& items) {
  if (round != unsent_timings_round_) {
    unsent_timings_.clear();
    unsent_timings_round_ = round;
  }
  if (!items.empty() && unsent_timings_.size() + items.size() < 60000) {  // a line stays under 64 KiB
    unsent_timings_ += (unsent_timings_.empty() ? "" : ",") + items;
  }
  if (unsent_timings_.empty() || !link_.is_open() || connecting_) return;
  if (Clock::now() - last_timings_sent_ < std::chrono::milliseconds(200)) return;
  link_.send(ddp::str("timings ", round, " ", unsent_timings_));
  unsent_timings_.clear();
  last_timings_sent_ = Clock::now();
}

std::vector<std::string> JobLink::take_timings(int round) {
  std::vector<std::string> out;
  for (auto& [r, items] : remote_timings_) {
    if (r == round) out.push_back(std::move(items));
  }
  remote_timings_.clear();
  return out;
}

std::string JobLink::describe_behind(int round, const std::vector<std::pair<int, std::int64_t>>& local) const {
  if (remote_steps_round_ != round || remote_steps_.empty()) return "";
  std::map<int, std::int64_t> all = remote_steps_;
  for (const auto& [rank, step] : local) all[rank] = step;
  const auto [lowest, highest] =
      std::minmax_element(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  const std::int64_t low = lowest->second, high = highest->second;
  if (low == high) return ddp::str(" (across the job, every rank heard of is at step ", low, ")");
  std::vector<std::string> behind;
  for (const auto& [rank, step] : all) {
    if (step == low) behind.push_back(name_of_rank(rank));
  }
  return ddp::str(" (across the job, did not arrive: ", ddp::join(behind, ", "), " at step ", low,
                  ", the others at up to ", high, ")");
}

RoundVerdict JobLink::finish_round(int round, const std::string& kind, double timeout_s, process::SignalPipe& signals,
                                   std::string& why) {
  const auto until = process::after_seconds(timeout_s);
  bool sent = false;
  while (true) {
    pump();
    if (!sent && link_.is_open() && !connecting_) {
      link_.send(ddp::str("ended ", round, " ", kind));
      sent = true;
    }
    if (const auto it = verdicts_.find(round); it != verdicts_.end()) {
      return it->second == "restart" ? RoundVerdict::kRestart : RoundVerdict::kDone;
    }
    if (coordinator_gone_) {
      why = news_.empty() ? "the job's coordinator is gone" : news_.front();
      return RoundVerdict::kNoAnswer;
    }
    if (Clock::now() >= until) {
      why = ddp::str(hello_sent_ ? "no word from " : "could not reach ", "the job's coordinator (", name_of_node(0),
                     " at ", options_.coordinator_host, ":", options_.coordinator_port, ") within ", timeout_s, " s");
      return RoundVerdict::kNoAnswer;
    }
    pollfd fds[2] = {{signals.read_fd(), POLLIN, 0}, {link_.fd(), poll_events(), 0}};
    ::poll(fds, link_.is_open() ? 2 : 1, 50);
    for (int sig : signals.drain()) {
      if (sig != SIGCHLD) {
        why = ddp::str("received ", process::signal_name(sig));
        return RoundVerdict::kSignalled;
      }
    }
  }
}

int JobLink::wait_for_store_port(double timeout_s) {
  const auto until = process::after_seconds(timeout_s);
  const std::string where =
      ddp::str("node 0's launcher at ", options_.coordinator_host, ":", options_.coordinator_port);
  while (true) {
    pump();
    if (store_port_ != 0) return store_port_;
    if (coordinator_gone_) {
      throw ddp::TimeoutError(ddp::str(where, " closed the connection after this node's hello (does another ",
                                       "launcher have --node_rank ", options_.node_rank, "?)"));
    }
    if (Clock::now() >= until) {
      throw ddp::TimeoutError(ddp::str(hello_sent_ ? "no welcome from " : "could not reach ", where, " within ",
                                       timeout_s, " s (--rdzv_timeout): start node 0 with the same --nnodes, ",
                                       "--master_addr and --master_port (its launcher listens there)"));
    }
    pollfd p{link_.fd(), poll_events(), 0};
    ::poll(&p, link_.is_open() ? 1 : 0, 50);
  }
}

std::string JobLink::name_of_node(int node) const {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return ddp::str("node ", node);
  return node_name(it->second.host, node, it->second.first_rank, it->second.nproc);
}

std::string JobLink::name_of_rank(int rank) const {
  for (const auto& [node, n] : nodes_) {
    if (rank >= n.first_rank && rank < n.first_rank + n.nproc) return ddp::str("rank ", rank, " on ", n.host);
  }
  return ddp::str("rank ", rank);
}

}  // namespace ddp::launcher::channel
