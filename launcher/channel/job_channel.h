#pragma once
// The launchers' job channel: one torch-free TCP connection from every node's launcher to the
// coordinator in node 0's launcher, over which a failure anywhere stops every host's worker group
// and all start the next round together. See Note [Coordinated restarts] in job_channel.cpp; the
// two ends: job_coordinator.h (node 0) and job_link.h (every node, node 0 included).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "launcher/config/config.h"
#include "launcher/rendezvous/rendezvous.h"

namespace ddp::launcher::channel {

class JobCoordinator;
class JobLink;

// One connection carrying '\n'-terminated lines, non-blocking both ways.
class LineConnection {
 public:
  LineConnection() = default;
  explicit LineConnection(int fd) : fd_(fd) {}
  ~LineConnection();
  LineConnection(const LineConnection&) = delete;
  LineConnection& operator=(const LineConnection&) = delete;
  LineConnection(LineConnection&& other) noexcept;
  LineConnection& operator=(LineConnection&& other) noexcept;

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }
  bool wants_write() const { return !out_.empty(); }
  // Queues `line` (without its '\n') and writes what the socket takes now.
  void send(const std::string& line);
  // Writes what the socket takes now; false when the connection broke.
  bool flush();
  // Reads what has arrived and calls on_line for each whole line; false on end of stream or error
  // (or a line over 64 KiB: not a launcher's).
  bool receive(const std::function<void(const std::string&)>& on_line);
  void close();
  // Sends "bye" and waits at most 1 s for it to be written (a few bytes into an empty socket buffer).
  void say_goodbye();

 private:
  int fd_ = -1;
  std::string in_;
  std::string out_;
};

// A non-blocking socket connecting to host:port (-1 when the name does not resolve now): poll it
// for POLLOUT and read SO_ERROR to learn whether it connected.
int start_connect(const std::string& host, int port);

// Wakes `thread`'s poll loop with an 'e' on the pipe `wake`, joins the thread, closes the pipe.
void end_thread(int (&wake)[2], std::thread& thread);

// "host1 (node 1, ranks 2-3)": how every launcher names a node.
std::string node_name(const std::string& host, int node, int first_rank, int nproc);

// The first word of `line` and the rest (split at the first space).
std::pair<std::string, std::string> split_word(const std::string& line);
// A number of the channel's lines: optional '-', at most 9 digits; nullopt for anything else.
std::optional<int> parse_line_int(const std::string& text);

// Both ends of this node's part in the job channel; destroyed in order (the link says goodbye,
// then the coordinator lingers, bounded, until the other launchers have heard the end).
class JobChannel {
 public:
  JobChannel(std::unique_ptr<JobCoordinator> coordinator, std::unique_ptr<JobLink> link, double success_linger_s,
             int store_port);
  ~JobChannel();
  JobChannel(const JobChannel&) = delete;
  JobChannel& operator=(const JobChannel&) = delete;
  JobLink* link() const { return link_.get(); }
  // How long node 0's launcher waits at the end for the other launchers to leave: the job
  // succeeded, so they are ending too (--rdzv_timeout), or it failed (1 s).
  void set_job_succeeded(bool succeeded) { succeeded_ = succeeded; }
  // A static job: the port of node 0's workers' store (MASTER_PORT of every worker), known at once
  // on node 0, else from the coordinator's welcome (waits at most timeout_s; See Note [One port
  // per job] in launcher/rendezvous/rendezvous.h).
  int workers_store_port(double timeout_s);

 private:
  std::unique_ptr<JobCoordinator> coordinator_;
  std::unique_ptr<JobLink> link_;
  double success_linger_s_;
  bool succeeded_ = false;
  int store_port_;
};

// The job channel of a multi-node job (nullptr with --nnodes 1). Node 0 binds the coordinator's
// port before any worker starts, every node starts connecting (See Note [One port per job] in
// launcher/rendezvous/rendezvous.h): with a rendezvous store (`directory`), on a port the OS picks, published
// as `name`; without one (a static job), on --master_port (UsageError when it is in use), the
// workers' store then on a free port of node 0 (workers_store_port()).
std::unique_ptr<JobChannel> open_job_channel(const config::LaunchConfig& config, const rendezvous::NodeAssignment& node,
                                             int nproc_per_node, const std::string& host_name,
                                             rendezvous::EndpointDirectory* directory, const std::string& name);

}  // namespace ddp::launcher::channel
