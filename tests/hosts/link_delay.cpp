// link_delay: a fixed delay (and random loss) on one namespace host's incoming packets, for kernels
// built without sch_netem. scripts/netns-cluster.sh starts one per host for --delay/--loss there.
//
//   link_delay --delay 1ms [--loss 0.5%] [--seed N] [--queue N] [--ready-file PATH]
//
// It binds an NFQUEUE (the host's `iptables -A INPUT -i eth0 -j NFQUEUE --queue-bypass` sends every
// packet that arrives on eth0 there), holds each packet for --delay and lets it through, or drops it
// with probability --loss. SIGTERM/SIGINT let every held packet through and exit 0; a bad option,
// a queue that cannot be bound, exit 2 with one line. See Note [A delay line without netem].

// Note [A delay line without netem]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Slow links have latency as well as a rate; `tc netem delay` adds it, but this machine's kernel has
// no sch_netem (nor fq, etf or any other qdisc that holds packets for a time: only tbf, htb, fifo and
// ingress). It has netfilter's NFQUEUE: the kernel hands packets to a program and keeps them until
// the program gives a verdict. Holding the verdict for the delay is a delay line:
// - Ingress, not egress. A packet held on the sender would still count against its socket in TCP
//   Small Queues (netem orphans its packets for that reason; NFQUEUE does not), which throttles a
//   sender to about 1 ms of its pacing rate below TCP. On the receiver the veth has already
//   orphaned the packet. Each packet crosses one receiver, so 1 ms there is 1 ms one way, as
//   netem's 1 ms on every host's egress: a 2 ms round trip between two hosts.
// - Meta data only (NFQNL_COPY_META) and GSO packets whole (NFQA_CFG_F_GSO): a 64 KB segment is one
//   message, no payload crosses into this program.
// - Packet ids rise in arrival order and the delay is fixed, so the held packets are a FIFO whose
//   due times rise too: one batch verdict (NFQNL_MSG_VERDICT_BATCH accepts every id up to one) lets
//   out everything that is due. A lost packet gets its own NF_DROP at once.
// - Precision: arrival is stamped when the message is read (the socket is drained at once); the
//   wait is a ppoll to the first due time with a 1 ns timer slack, under SCHED_FIFO where allowed,
//   so a loaded machine's scheduler adds little. What it adds only lengthens the delay.
// - --queue-bypass on the rule: with no program bound (not started yet, or gone), packets pass
//   undelayed instead of being dropped.

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::chrono::nanoseconds delay{0};
  double loss = 0.0;  // probability, 0..1
  std::uint64_t seed = 1;
  std::uint16_t queue = 0;
  std::uint32_t max_held = 20000;  // packets the kernel keeps for us before it drops new ones
  std::string ready_file;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::chrono::nanoseconds parse_duration(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit == "us") scale = 1e3;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "s") scale = 1e9;
  if (used == 0 || scale == 0 || !(value >= 0) || value * scale > 10e9)
    throw UsageError("--delay '" + text + "': a duration from 0 to 10 s with a unit, e.g. 1ms, 500us");
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::llround(value * scale)));
}

double parse_loss(const std::string& text) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string rest = text.substr(used);
  if (used == 0 || (rest != "%" && !rest.empty()) || !(value >= 0 && value <= 100))
    throw UsageError("--loss '" + text + "': a percentage from 0 to 100, e.g. 1%");
  return value / 100.0;
}

unsigned long long parse_count(const std::string& flag, const std::string& text, unsigned long long most) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || text[0] == '-' || value > most)
    throw UsageError(flag + " '" + text + "': a whole number from 0 to " + std::to_string(most));
  return value;
}

Options parse_options(int argc, char** argv) {
  Options options;
  bool have_delay = false;
  // Every option takes a value: an unknown one is refused before its value is looked for.
  const std::map<std::string, std::function<void(const std::string&)>> setters = {
      {"--delay",
       [&](const std::string& value) {
         options.delay = parse_duration(value);
         have_delay = true;
       }},
      {"--loss", [&](const std::string& value) { options.loss = parse_loss(value); }},
      {"--seed", [&](const std::string& value) { options.seed = parse_count("--seed", value, ~0ULL); }},
      {"--queue",
       [&](const std::string& value) { options.queue = static_cast<std::uint16_t>(parse_count("--queue", value, 65535)); }},
      {"--ready-file", [&](const std::string& value) { options.ready_file = value; }},
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("usage: link_delay --delay D [--loss P%%] [--seed N] [--queue N] [--ready-file PATH]\n");
      std::exit(0);
    }
    const auto setter = setters.find(flag);
    if (setter == setters.end()) throw UsageError("unknown option " + flag + " (link_delay --help)");
    if (i + 1 >= argc) throw UsageError(flag + " needs a value (link_delay --help)");
    setter->second(argv[++i]);
  }
  if (!have_delay && options.loss == 0) throw UsageError("nothing to do: give --delay and/or --loss");
  return options;
}

// One NFQUEUE over raw netlink (no libnetfilter_queue: the messages are few and small).
class NfQueue {
 public:
  explicit NfQueue(std::uint16_t queue) : queue_(queue) {
    fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (fd_ < 0) fail("netlink socket");
    const int on = 1;
    setsockopt(fd_, SOL_NETLINK, NETLINK_NO_ENOBUFS, &on, sizeof on);
    const int buffer = 8 << 20;
    if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
      setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) fail("netlink bind");
  }
  ~NfQueue() {
    if (fd_ >= 0) close(fd_);
  }
  NfQueue(const NfQueue&) = delete;
  NfQueue& operator=(const NfQueue&) = delete;

  int fd() const { return fd_; }

  void bind_queue(std::uint32_t max_held) {
    nfqnl_msg_config_cmd cmd{};
    cmd.command = NFQNL_CFG_CMD_BIND;
    cmd.pf = htons(AF_INET);
    config({{NFQA_CFG_CMD, bytes_of(cmd)}});
    nfqnl_msg_config_params params{};
    params.copy_range = htonl(0);
    params.copy_mode = NFQNL_COPY_META;
    const std::uint32_t max_len = htonl(max_held);
    const std::uint32_t flags = htonl(NFQA_CFG_F_GSO);
    config({{NFQA_CFG_PARAMS, bytes_of(params)},
            {NFQA_CFG_QUEUE_MAXLEN, bytes_of(max_len)},
            {NFQA_CFG_FLAGS, bytes_of(flags)},
            {NFQA_CFG_MASK, bytes_of(flags)}});
  }

  void unbind_queue() {
    nfqnl_msg_config_cmd cmd{};
    cmd.command = NFQNL_CFG_CMD_UNBIND;
    send_message(NFQNL_MSG_CONFIG, {{NFQA_CFG_CMD, bytes_of(cmd)}}, false);
  }

  // Reads every message waiting; returns the ids of the packets, in arrival order.
  void drain(std::vector<std::uint32_t>& ids) {
    for (;;) {
      const ssize_t got = recv(fd_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) return;
        fail("netlink recv");
      }
      auto length = static_cast<int>(got);
      for (auto* header = reinterpret_cast<nlmsghdr*>(buffer_.data()); NLMSG_OK(header, length);
           header = NLMSG_NEXT(header, length)) {
        if (header->nlmsg_type != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET)) continue;
        const std::uint32_t id = packet_id(header);
        if (id != 0) ids.push_back(id);
      }
    }
  }

  void verdict(std::uint32_t id, std::uint32_t verdict, bool batch) {
    nfqnl_msg_verdict_hdr body{};
    body.verdict = htonl(verdict);
    body.id = htonl(id);
    send_message(batch ? NFQNL_MSG_VERDICT_BATCH : NFQNL_MSG_VERDICT, {{NFQA_VERDICT_HDR, bytes_of(body)}},
                 false);
  }

 private:
  struct Attribute {
    std::uint16_t type;
    std::string payload;
  };

  template <typename T>
  static std::string bytes_of(const T& value) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof value);
  }

  [[noreturn]] static void fail(const std::string& what) {
    throw std::runtime_error(what + ": " + std::strerror(errno));
  }

  static std::uint32_t packet_id(const nlmsghdr* header) {
    const auto* base = reinterpret_cast<const char*>(NLMSG_DATA(header)) + NLMSG_ALIGN(sizeof(nfgenmsg));
    int left = static_cast<int>(header->nlmsg_len) - static_cast<int>(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)));
    while (left >= static_cast<int>(NLA_HDRLEN)) {
      const auto* attribute = reinterpret_cast<const nlattr*>(base);
      if (attribute->nla_len < NLA_HDRLEN || attribute->nla_len > left) return 0;
      if ((attribute->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
          attribute->nla_len >= NLA_HDRLEN + sizeof(nfqnl_msg_packet_hdr)) {
        nfqnl_msg_packet_hdr packet{};
        std::memcpy(&packet, base + NLA_HDRLEN, sizeof packet);
        return ntohl(packet.packet_id);
      }
      base += NLA_ALIGN(attribute->nla_len);
      left -= static_cast<int>(NLA_ALIGN(attribute->nla_len));
    }
    return 0;
  }

  void config(const std::vector<Attribute>& attributes) { send_message(NFQNL_MSG_CONFIG, attributes, true); }

  void send_message(std::uint16_t type, const std::vector<Attribute>& attributes, bool acknowledged) {
    std::string message(NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(nfgenmsg)), '\0');
    for (const Attribute& attribute : attributes) {
      nlattr header{};
      header.nla_len = static_cast<std::uint16_t>(NLA_HDRLEN + attribute.payload.size());
      header.nla_type = attribute.type;
      message += bytes_of(header);
      message += attribute.payload;
      message.resize(NLA_ALIGN(message.size()), '\0');
    }
    auto* header = reinterpret_cast<nlmsghdr*>(message.data());
    header->nlmsg_len = static_cast<std::uint32_t>(message.size());
    header->nlmsg_type = static_cast<std::uint16_t>((NFNL_SUBSYS_QUEUE << 8) | type);
    header->nlmsg_flags = NLM_F_REQUEST | (acknowledged ? NLM_F_ACK : 0);
    header->nlmsg_seq = ++sequence_;
    auto* family = reinterpret_cast<nfgenmsg*>(message.data() + NLMSG_HDRLEN);
    family->nfgen_family = AF_UNSPEC;
    family->version = NFNETLINK_V0;
    family->res_id = htons(queue_);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (sendto(fd_, message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0)
      fail("netlink send");
    if (acknowledged) wait_ack(header->nlmsg_seq);
  }

  void wait_ack(std::uint32_t sequence) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      pollfd ready{fd_, POLLIN, 0};
      if (poll(&ready, 1, 2000) <= 0) throw std::runtime_error("the kernel did not answer a queue configuration in 2 s");
      const ssize_t got = recv(fd_, buffer_.data(), buffer_.size(), 0);
      if (got < 0) fail("netlink recv");
      auto length = static_cast<int>(got);
      for (auto* header = reinterpret_cast<nlmsghdr*>(buffer_.data()); NLMSG_OK(header, length);
           header = NLMSG_NEXT(header, length)) {
        if (header->nlmsg_type != NLMSG_ERROR || header->nlmsg_seq != sequence) continue;
        const auto* error = reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(header));
        if (error->error == 0) return;
        errno = -error->error;
        fail("configuring NFQUEUE " + std::to_string(queue_) +
             (errno == EPERM || errno == EBUSY ? " (another program has bound it: one link_delay per host)" : ""));
      }
    }
    throw std::runtime_error("no answer to a queue configuration");
  }

  int fd_ = -1;
  std::uint16_t queue_;
  std::uint32_t sequence_ = 0;
  std::vector<char> buffer_ = std::vector<char>(1 << 20);
};

volatile sig_atomic_t stop_requested = 0;
void request_stop(int) { stop_requested = 1; }

struct Held {
  std::uint32_t id;
  Clock::time_point due;
};

int run(const Options& options) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  sched_param priority{};
  priority.sched_priority = 10;
  sched_setscheduler(0, SCHED_FIFO, &priority);  // best effort; see Note [A delay line without netem]

  // The stop signals are blocked but while ppoll waits, so a stop is seen between two waits.
  sigset_t stops, during_wait;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigprocmask(SIG_BLOCK, &stops, &during_wait);
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  NfQueue queue(options.queue);
  queue.bind_queue(options.max_held);
  if (!options.ready_file.empty()) {
    std::ofstream ready(options.ready_file);
    ready << getpid() << "\n";
    if (!ready) throw std::runtime_error("cannot write --ready-file " + options.ready_file);
  }

  std::mt19937_64 random(options.seed);
  std::bernoulli_distribution lost(options.loss);
  std::deque<Held> held;
  std::vector<std::uint32_t> arrived;
  while (!stop_requested) {
    timespec wait{0, 200'000'000};  // nothing held: wake now and then only to see a stop
    if (!held.empty()) {
      const auto left = std::max(Clock::duration::zero(), held.front().due - Clock::now());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      wait = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }
    pollfd ready{queue.fd(), POLLIN, 0};
    const int events = ppoll(&ready, 1, &wait, &during_wait);
    if (events < 0 && errno != EINTR) throw std::runtime_error(std::string("ppoll: ") + std::strerror(errno));
    if (events > 0) {
      arrived.clear();
      queue.drain(arrived);
      const auto now = Clock::now();
      for (const std::uint32_t id : arrived) {
        if (options.loss > 0 && lost(random)) queue.verdict(id, NF_DROP, false);
        else held.push_back({id, now + options.delay});
      }
    }
    const auto now = Clock::now();
    std::uint32_t last_due = 0;
    while (!held.empty() && held.front().due <= now) {
      last_due = held.front().id;
      held.pop_front();
    }
    if (last_due != 0) queue.verdict(last_due, NF_ACCEPT, true);
  }
  if (!held.empty()) queue.verdict(held.back().id, NF_ACCEPT, true);
  queue.unbind_queue();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_options(argc, argv));
  } catch (const UsageError& error) {
    std::fprintf(stderr, "link_delay: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "link_delay: %s (root or CAP_NET_ADMIN, and the kernel's nfnetlink_queue, are needed)\n",
                 error.what());
    return 2;
  }
}
