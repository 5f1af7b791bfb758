#pragma once
// The coordinator of the job channel, in node 0's launcher: it learns every node's host and ranks,
// relays failures, losses and progress to every launcher, and says after each round whether the
// job restarts or ends. See Note [Coordinated restarts] in launcher/channel/job_channel.cpp.
#include <atomic>
#include <thread>

namespace ddp::launcher::channel {

struct JobCoordinatorOptions {
  int nnodes = 1;
  int max_restarts = 0;
  // How long a round waits, after its first failure, for every node to report its group's end.
  double join_timeout_s = 600;
  // A static job's workers' store port on node 0, told in each welcome (0: none; See Note [One
  // port per job] in launcher/rendezvous/rendezvous.h).
  int store_port = 0;
};

class JobCoordinator {
 public:
  // Serves on `listen_fd` (bound and listening; taken over) on a thread of its own.
  JobCoordinator(int listen_fd, JobCoordinatorOptions options);
  // Ends the thread: every launcher still connected is told the job ended, and then given up to
  // `linger_s` (see set_linger) to leave before the sockets close.
  ~JobCoordinator();
  JobCoordinator(const JobCoordinator&) = delete;
  JobCoordinator& operator=(const JobCoordinator&) = delete;
  void set_linger(double linger_s) { linger_s_ = linger_s; }

 private:
  std::atomic<double> linger_s_{3};
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace ddp::launcher::channel
