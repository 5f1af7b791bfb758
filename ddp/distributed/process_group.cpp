#include "ddp/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <ATen/Parallel.h>
#include <c10/util/Logging.h>
#include <torch/cuda.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "ddp/distributed/detail/collective_wait.h"
#include "ddp/distributed/detail/process_group_state.h"
#include "ddp/distributed/detail/sliced_allreduce.h"
#include "ddp/runtime/detail/cuda_support.h"
#include "ddp/distributed/detail/join_wait.h"
#include "ddp/runtime/uncaught_exception.h"
#include "ddp/base/worker_variable_names.h"
#include "ddp/distributed/hierarchical_collectives.h"
#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"
#include "ddp/base/detail/route.h"
#include "ddp/base/detail/store_values.h"

namespace ddp {
namespace {

using std::chrono::milliseconds;

// An explicit slice size: bytes >= 0 or kAllreduceSliceAuto; `options` names the struct in the error.
std::int64_t checked_slice_bytes(std::int64_t bytes, const char* options) {
  if (bytes < kAllreduceSliceAuto) {
    throw InvalidArgument(str(options, "::allreduce_slice_bytes must be >= 0 or kAllreduceSliceAuto, got ", bytes));
  }
  return bytes;
}

using detail::mentions_peer_loss;
using detail::mentions_timeout;

// c10d reports failures as c10::Error subclasses with long messages; ours say what was being done.
[[noreturn]] void rethrow_as_ddp(const std::exception& error, const std::string& context) {
  const std::string what = error.what();
  if (mentions_timeout(what)) throw TimeoutError(str(context, ": ", first_line(what)));
  throw CommunicationError(str(context, ": ", first_line(what)));
}

// How joining waits and talks about it. See Note [Waiting is never silent] in ddp/distributed/detail/join_wait.h.
struct JoinWait {
  milliseconds timeout;
  milliseconds notice_every;
  std::string address;  // "host:port", or the rendezvous file
  const Logger* logger;
};

// Waits at most `slice` for `key`; false when the slice passed (other store errors are thrown).
bool wait_for_key(c10d::Store& store, const std::string& key, milliseconds slice) {
  try {
    store.wait({key}, slice);
    return true;
  } catch (const std::exception& error) {
    if (mentions_timeout(error.what())) return false;
    throw;
  }
}

// What a hierarchical collective's stage errors are prefixed with: the collective of this group.
std::string hierarchical_context(std::int64_t seq, const char* what, const torch::Tensor& tensor) {
  return str(what, " #", seq, " (hierarchical, ", detail::format_bytes(tensor.numel() * tensor.element_size()), ")");
}

// Note [World size check]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every rank publishes the world size it was told; each rank compares its own with rank 0's, and
// rank 0 compares with everybody's. A rank that disagrees fails with ddp::MismatchError before the
// backend's rendezvous, which would otherwise wait for ranks that do not exist.
void check_world_size(c10d::Store& store, int rank, int world_size, const JoinWait& join) {
  const milliseconds timeout = join.timeout;
  const auto key = [](int r) { return str("ddp/world_size/", r); };
  const auto ack = [](int r) { return str("ddp/world_size_ack/", r); };
  const auto notice = [&](int r, milliseconds waited) {
    if (rank != 0) return join.logger->warn(detail::waiting_for_rank0_notice(rank, join.address, waited, timeout));
    std::vector<int> missing;
    for (int q = r; q < world_size; ++q) {
      if (!store.check({key(q)})) missing.push_back(q);
    }
    join.logger->warn(detail::waiting_for_ranks_notice(missing, world_size, join.address, waited, timeout));
  };
  const auto fetch = [&](int r) {
    if (!detail::wait_with_notices(
            timeout, join.notice_every, [&](milliseconds slice) { return wait_for_key(store, key(r), slice); },
            [&](milliseconds waited) { notice(r, waited); })) {
      throw TimeoutError(str("rank ", rank, " waited ", detail::seconds_of(timeout), " s for rank ", r,
                             " to join (WORLD_SIZE=", world_size, ", join timeout: --rdzv_conf join_timeout=S or ",
                             env::kJoinTimeout, "=S): start all ranks, or check that they use the same ",
                             "MASTER_ADDR/MASTER_PORT"));
    }
    return std::stoi(detail::bytes_to_text(store.get(key(r))));
  };
  const auto mismatch = [&](int other_rank, int other) {
    return MismatchError(str("inconsistent world size: rank ", rank, " has WORLD_SIZE=", world_size,
                             " but rank ", other_rank, " has WORLD_SIZE=", other,
                             "; every process must be started with the same world size"));
  };
  try {
    store.set(key(rank), detail::to_bytes(std::to_string(world_size)));
    if (rank != 0) {
      const int root = fetch(0);
      store.set(ack(rank), detail::to_bytes("read"));  // rank 0 may now fail and take the store down
      if (root != world_size) throw mismatch(0, root);
      return;
    }
    for (int r = 1; r < world_size; ++r) {
      const int other = fetch(r);
      if (other != world_size) {
        // Let rank r read rank 0's value first, so that it reports the mismatch too.
        try {
          store.wait({ack(r)}, std::min(timeout, milliseconds(10000)));
        } catch (const std::exception&) {
        }
        throw mismatch(r, other);
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    rethrow_as_ddp(error, str("rank ", rank, " lost the rendezvous store while checking the world size"));
  }
}

// Note [Loopback store]
// ~~~~~~~~~~~~~~~~~~~~~
// c10d's TCPStore server listens on every interface whatever host it is given, so a single-node job
// (MASTER_ADDR 127.0.0.1: ddp_launch --standalone, or its default) would expose its store to the
// network, and a multi-node one to every network the master host is on. Whenever the master
// address is one of this host's, rank 0 binds the listening socket itself to exactly that address
// and hands it to the store (TCPStoreOptions::masterListenFd, which both of c10d's store backends
// take over): a loopback master listens on loopback only, a network master on that address only.
// The one exception is a name that resolves to loopback here but not on the peers' hosts (See Note
// [Advertised address] in ddp/base/detail/route.h): that store listens on every interface. Returns no fd
// when the address is not this host's (the store binds as before).
std::optional<int> listen_on_master_address(const std::string& host, int port, bool peers_on_other_hosts) {
  const std::string address = detail::store_listen_address(detail::look_up_route(host), peers_on_other_hosts);
  if (address.empty()) return std::nullopt;
  const int fd = detail::listen_on_address(address, port);
  if (fd >= 0) return fd;
  if (errno == EADDRNOTAVAIL) return std::nullopt;
  throw CommunicationError(str("rank 0 could not listen on ", host, ":", port, ": ", std::strerror(errno),
                               " (is the port in use? pick another MASTER_PORT)"));
}

c10::intrusive_ptr<c10d::Store> make_store(const InitMethod& method, const std::string& host, int port,
                                           int rank, int world_size, milliseconds timeout,
                                           bool peers_on_other_hosts, const JoinWait& join) {
  if (method.kind == InitMethod::Kind::kFile) {
    try {
      return c10::make_intrusive<c10d::FileStore>(method.path, world_size);
    } catch (const std::exception& error) {
      throw IoError(str("cannot use the rendezvous file ", method.path, ": ", error.what()));
    }
  }
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = rank == 0;
  store_options.numWorkers = world_size;
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  if (rank == 0) {  // See Note [Loopback store]
    store_options.masterListenFd = listen_on_master_address(host, port, peers_on_other_hosts);
  }
  // See Note [Bounded connect to the master] in ddp/base/detail/route.h.
  // See Note [Waiting is never silent] in ddp/distributed/detail/join_wait.h.
  if (rank != 0 &&
      !detail::wait_with_notices(
          join.timeout, join.notice_every,
          [&](milliseconds slice) { return detail::wait_until_listening(host, port, std::chrono::steady_clock::now() + slice); },
          [&](milliseconds waited) {
            join.logger->warn(detail::master_unreachable_notice(rank, join.address, waited, join.timeout));
          })) {
    throw CommunicationError(str("rank ", rank, " could not reach the master at ", host, ":", port,
                                 " within the join timeout of ", detail::seconds_of(join.timeout),
                                 " s: nothing accepted a connection there",
                                 " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?)"));
  }
  try {
    // Note [Quiet store connect]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~
    // c10d warns when the reverse lookup of a socket's address fails ("The hostname of the client
    // socket cannot be retrieved"), as it does on hosts whose own network address has no name (no
    // reverse DNS, Debian's /etc/hosts): noise, the store works. Only c10's errors are shown while
    // the store connects, unless TORCH_CPP_LOG_LEVEL asks for more.
    struct RestoreLogLevel {
      int level = FLAGS_caffe2_log_level;
      ~RestoreLogLevel() { FLAGS_caffe2_log_level = level; }
    } restore;
    if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = std::max(restore.level, 2);
    return c10::make_intrusive<c10d::TCPStore>(host, store_options);
  } catch (const std::exception& error) {
    const std::string what = error.what();
    if (rank == 0) {
      throw CommunicationError(str("rank 0 could not listen on ", host, ":", port, ": ",
                                   first_line(what),
                                   " (is the port in use? pick another MASTER_PORT)"));
    }
    throw CommunicationError(str("rank ", rank, " could not reach the master at ", host, ":", port,
                                 " within ", detail::seconds_of(timeout), " s: ", first_line(what),
                                 " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?)"));
  }
}

// Note [Threads per rank]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Several ranks on one host each default to one intra-op thread per core and oversubscribe it
// (2 ranks on 2 cores run 4 busy threads). OMP_NUM_THREADS, when set (torchrun and ddp_launch set
// it), is applied to LibTorch's intra-op pool; otherwise the cores are shared out among local ranks.
void set_threads_per_rank(const EnvLookup& env, int local_size, const Logger& logger) {
  int threads = 0;
  if (auto value = parse_omp_num_threads(env)) {
    threads = *value;
  } else if (local_size > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / local_size);
    logger.debug(str("OMP_NUM_THREADS is not set: using ", threads, " threads for ", local_size,
                     " local ranks"));
  }
  if (threads > 0 && at::get_num_threads() != threads) at::set_num_threads(threads);
}

// Note [Gloo's timeout is a backstop]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Gloo operation that times out closes its connections to the peers it waited for. When Gloo's
// bound was the group's timeout, the rank that entered a hung collective first closed them at its
// timeout, and a peer that entered its own collective a little later (on a loaded machine, tens to
// hundreds of ms) failed at once with "Connection closed by peer" instead of timing out: it did not
// take part in the arrival check (Note [Naming the ranks that did not arrive] in
// ddp/distributed/detail/collective_log.cpp), its root cause read as a crashed peer, and when it was
// the store's host it left with the store while the first rank still read it. faults.diag's desync
// case failed so once in a soak round (rank 1's extra barrier timed out, rank 0's all-reduce got
// the closed connection). So the wait in wait_collective owns the timeout and Gloo's bound on each
// operation is a backstop past it and the arrival check (window and linger): by then every rank
// that timed out has reported. Connecting the group keeps the group's timeout. The cost: a process
// that destroys its group after a timeout waits in ProcessGroupGloo's destructor for the operation
// still in flight to reach the backstop, up to the arrival window + 2 s longer than before
// (faults.diag's hung rank: its peers gone 6.2 s after the hang began, 4.2 s before, with a 2 s
// timeout); a training's timeout is minutes. FaultTolerant destroys an aborted group on a thread
// of its own (Note [Releasing an aborted group] in ddp/elastic/fault_tolerant.cpp): no wait there.
std::chrono::milliseconds gloo_backstop(std::chrono::milliseconds timeout) {
  return timeout + detail::arrival_window(timeout) + detail::kArrivalLingerSlack + std::chrono::milliseconds(1000);
}

// Where Gloo's transport binds: the interface GLOO_SOCKET_IFNAME names, a host name, or Gloo's default.
// A Gloo backend with one device per advertised interface and one for the advertised address (see
// Note [Advertised address] in ddp/base/detail/route.h).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    const ProcessGroup::Info& info,
                                                    const detail::AdvertisedAddress& advertised) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(info.timeout);
  for (const std::string& name : advertised.interfaces) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
  }
  if (!advertised.address.empty()) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(advertised.address));
  }
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, info.rank, info.size, gloo_options);
  backend->setTimeout(gloo_backstop(info.timeout));  // See Note [Gloo's timeout is a backstop]
  return backend;
}

}  // namespace

bool nccl_available() {
#ifdef USE_C10D_NCCL
  return torch::cuda::is_available();
#else
  return false;
#endif
}

ProcessGroup::ProcessGroup(Info info, c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::Backend> backend)
    : state_(std::make_unique<State>(std::move(info), std::move(store), std::move(backend))) {}

ProcessGroup::~ProcessGroup() { destroy(); }

int ProcessGroup::rank() const { return state_->info.rank; }
int ProcessGroup::size() const { return state_->info.size; }
int ProcessGroup::local_rank() const { return state_->info.local_rank; }
int ProcessGroup::local_size() const { return state_->info.local_size; }
const std::string& ProcessGroup::backend_name() const { return state_->info.backend_name; }
torch::Device ProcessGroup::device() const { return state_->info.device; }
milliseconds ProcessGroup::timeout() const { return state_->info.timeout; }
const Logger& ProcessGroup::logger() const { return state_->logger; }
const std::string& ProcessGroup::log_dir() const { return state_->info.log_dir; }
const c10::intrusive_ptr<c10d::Store>& ProcessGroup::store() const { return state_->store; }
bool ProcessGroup::aborted() const { return state_->aborted.load(); }
bool ProcessGroup::destroyed() const { return !state_->backend; }
void ProcessGroup::set_collective_algorithm(CollectiveAlgorithm algorithm) { state_->algorithm = algorithm; }
CollectiveAlgorithm ProcessGroup::collective_algorithm() const { return state_->algorithm; }
std::vector<CollectiveRecord> ProcessGroup::recent_collectives() const { return state_->collectives.snapshot(); }
std::int64_t ProcessGroup::last_collective_seq() const { return state_->collectives.last_seq(); }

void ProcessGroup::set_allreduce_slice_bytes(std::int64_t bytes) {
  state_->info.allreduce_slice_bytes = std::max<std::int64_t>(bytes, kAllreduceSliceAuto);
}

std::int64_t ProcessGroup::allreduce_slice_bytes() const {
  const Info& info = state_->info;
  if (info.allreduce_slice_bytes != kAllreduceSliceAuto) return info.allreduce_slice_bytes;
  return info.spans_hosts ? kDefaultAllreduceSliceBytes : 0;
}

const c10::intrusive_ptr<c10d::Backend>& ProcessGroup::backend() const {
  if (!state_->backend) throw Error(str("rank ", state_->info.rank, ": the process group was destroyed"));
  return state_->backend;
}

void ProcessGroup::destroy() { take_resources().reset(); }

std::shared_ptr<void> ProcessGroup::take_resources() {
  if (!state_->backend && !state_->hierarchy && !state_->store) return nullptr;
  struct Resources {
    std::unique_ptr<HierarchicalCollectives> hierarchy;
    c10::intrusive_ptr<c10d::Backend> backend;
    c10::intrusive_ptr<c10d::Store> store;
    ~Resources() { hierarchy.reset(); }  // first: its worker may still use the sub-groups
  };
  auto resources = std::make_shared<Resources>();
  resources->hierarchy = std::move(state_->hierarchy);
  resources->backend = std::move(state_->backend);
  resources->store = std::move(state_->store);
  return resources;
}

// Note [Aborting a group]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// abort() sets the flag that every blocking wait of the group polls (kAbortPollInterval). That is
// all Gloo needs: its collectives are waited for on the host, and the owner's destroy() then lets
// Gloo close the pairs, so the peers fail at once (FaultTolerant destroys an aborted group on a
// thread of its own: See Note [Releasing an aborted group] in ddp/elastic/fault_tolerant.cpp). c10d's ProcessGroupGloo keeps Backend::abort(), a
// no-op (torch 2.13 and 2.14: only its send and recv works override abort), so it is not called. An
// NCCL collective on CUDA tensors is waited for stream-ordered (Note [Which waits block the host] in
// ddp/runtime/detail/cuda_support.h): the host does not block in it, but a kernel whose peer is gone spins on the
// device and every later kernel of the stream waits behind it. ProcessGroupNCCL::abort() aborts its
// communicators (ncclCommAbort): the kernel ends, the stream drains, and the group's later work fails
// instead of hanging until the watchdog's timeout. It is called once, from whichever thread aborts
// first; the owner must not destroy() the group concurrently (it destroys it after abort()).
void ProcessGroup::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(state_->abort_mutex);
    if (state_->aborted.load()) return;
    state_->abort_reason = reason;
    state_->aborted.store(true);
  }
  if (state_->info.backend_name == "nccl" && state_->backend) state_->backend->abort();
}

std::int64_t ProcessGroup::begin_collective(const char* op, const char* what, int bucket,
                                           const torch::Tensor* tensor, const char* algorithm) const {
  CollectiveRecord record;
  record.op = op;
  record.what = what;
  record.bucket = bucket;
  record.algorithm = algorithm;
  if (tensor != nullptr && tensor->defined()) {
    record.wait = to_string(detail::cuda::wait_mode(state_->info.backend_name, tensor->device()));
    record.numel = tensor->numel();
    record.dtype = c10::toString(tensor->scalar_type());
    record.bytes = record.numel * static_cast<std::int64_t>(tensor->element_size());
  }
  record.start_unix_us = detail::unix_now_us();
  return state_->collectives.begin(record);
}

void ProcessGroup::wait_collective(std::int64_t seq, const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                                   milliseconds timeout, detail::WaitMode mode) const {
  try {
    if (mode == detail::WaitMode::kStreamOrdered) {
      work->wait();  // See Note [Which waits block the host] in ddp/runtime/detail/cuda_support.h.
    } else {
      const auto outcome = detail::wait_abortable(work, timeout, kAbortPollInterval, state_->aborted);
      if (outcome == detail::WaitOutcome::kAborted) {
        std::lock_guard<std::mutex> lock(state_->abort_mutex);
        throw PeerLostError(str(what, " #", seq, " on rank ", global_rank(state_->info.rank), ": the process group was aborted",
                                state_->abort_reason.empty() ? "" : ": ", state_->abort_reason));
      }
      if (outcome == detail::WaitOutcome::kTimedOut) fail_collective(seq, what, timeout, nullptr);
    }
  } catch (const Error& error) {
    // Already ours: a stage of a hierarchical collective, whose message names the sub-group.
    if (seq > 0) {
      state_->collectives.finish(seq, CollectiveState::kFailed);
      write_collectives_dump(error.what());
    }
    throw;
  } catch (const std::exception& error) {
    fail_collective(seq, what, timeout, &error);
  }
  if (seq > 0) state_->collectives.finish(seq, CollectiveState::kCompleted);
}

void ProcessGroup::fail_collective(std::int64_t seq, const char* what, milliseconds timeout,
                                   const std::exception* error) const {
  const std::string cause = error == nullptr ? std::string("did not finish") : std::string(error->what());
  const bool timed_out = error == nullptr || mentions_timeout(cause);
  std::optional<CollectiveRecord> record;
  if (seq > 0) {
    state_->collectives.finish(seq, CollectiveState::kFailed);
    record = state_->collectives.find(seq);
  }
  std::string name = seq > 0 ? str(what, " #", seq) : std::string(what);
  if (!state_->info.group_name.empty()) name += str(" in sub-group ", state_->info.group_name);
  if (record && record->bytes > 0) {
    name += record->bucket >= 0 ? str(" (bucket ", record->bucket, ", ", detail::format_bytes(record->bytes), ")")
                                : str(" (", detail::format_bytes(record->bytes), ")");
  }
  // The ring buffer is written first: a rank still waiting for reports below may be stopped by
  // the launcher (a peer failed first) before it can write the final version.
  std::optional<std::string> dump;
  const auto write_dump = [&](const std::string& reason) { dump = write_collectives_dump(reason); };
  std::string message;
  if (timed_out) {
    message = str(name, " timed out after ", detail::seconds_of(timeout), " s on rank ", global_rank(state_->info.rank));
    if (seq > 0 && state_->info.size > 1 && state_->store) {
      write_dump(message + " (checking which ranks arrived)");
      // See Note [Naming the ranks that did not arrive] (ddp/distributed/detail/collective_log.cpp).
      const auto store = c10::make_intrusive<c10d::PrefixStore>("ddp/collectives", state_->store);
      const detail::ArrivalStore arrivals{
          [store](const std::string& key, const std::string& value) { store->set(key, detail::to_bytes(value)); },
          [store](const std::string& key) -> std::optional<std::string> {
            if (!store->check({key})) return std::nullopt;
            return detail::bytes_to_text(store->get(key));
          }};
      const auto window = detail::arrival_window(timeout);
      detail::ArrivalReport report = detail::check_arrivals(arrivals, state_->info.rank, state_->info.size, detail::Arrival{seq, what}, window,
                                            /*linger=*/state_->info.rank == 0);
      report.last_completed = state_->collectives.last_completed();
      detail::separate_still_inside(report, [this](std::int64_t earlier) {
        const auto record = state_->collectives.find(earlier);
        return record && record->state == CollectiveState::kCompleted;
      });
      message += str(": ", detail::describe_arrivals(detail::in_global_ranks(report, [this](int r) { return global_rank(r); })));
    }
  } else {
    message = str(name, " failed on rank ", global_rank(state_->info.rank), ": ", first_line(cause));
  }
  write_dump(message);
  if (dump) message += str(" [this rank's last collectives: ", *dump, "]");
  if (timed_out) throw TimeoutError(message);
  if (mentions_peer_loss(cause)) throw PeerLostError(message);
  throw CommunicationError(message);
}

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
  const std::int64_t seq = state_->collectives.find_started(work.get()).value_or(0);
  const auto record = state_->collectives.find(seq);
  const bool stream_ordered = record && std::string(record->wait) == to_string(detail::WaitMode::kStreamOrdered);
  wait_collective(seq, work, what, state_->info.timeout,
                  stream_ordered ? detail::WaitMode::kStreamOrdered : detail::WaitMode::kBlocking);
}

void ProcessGroup::barrier(std::optional<milliseconds> timeout) {
  const milliseconds bound = timeout.value_or(state_->info.timeout);
  c10d::BarrierOptions options;
  options.timeout = state_->info.backend_name == "gloo" ? gloo_backstop(bound) : bound;  // See Note [Gloo's timeout is a backstop]
  const auto seq = begin_collective("barrier", "barrier", -1, nullptr);
  wait_collective(seq, start_collective(seq, "barrier", [&] { return backend()->barrier(options); }), "barrier", bound);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::allreduce_async(torch::Tensor& tensor, const char* what, int bucket) {
  if (auto* hierarchical = hierarchical_for(tensor, c10d::ReduceOp::SUM)) {
    const auto seq = begin_collective("allreduce", what, bucket, &tensor, "hierarchical");
    return start_collective(seq, what, [&] {
      return hierarchical->allreduce(tensor, c10d::ReduceOp::SUM, hierarchical_context(seq, what, tensor));
    });
  }
  const auto seq = begin_collective("allreduce", what, bucket, &tensor);
  return start_collective(seq, what, [&] { return start_flat_allreduce(tensor, c10d::AllreduceOptions()); });
}

// See Note [Sliced all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp.
c10::intrusive_ptr<c10d::Work> ProcessGroup::start_flat_allreduce(torch::Tensor& tensor,
                                                                  const c10d::AllreduceOptions& options) {
  const bool sliceable = state_->info.size > 1 && state_->info.backend_name == "gloo" && tensor.defined() &&
                         tensor.device().is_cpu() && tensor.layout() == torch::kStrided && tensor.is_contiguous();
  const auto slices = sliceable ? detail::allreduce_slices(tensor.numel(), static_cast<std::int64_t>(tensor.element_size()),
                                                   allreduce_slice_bytes())
                                : std::vector<detail::Slice>{};
  if (slices.size() <= 1) {
    std::vector<torch::Tensor> tensors{tensor};
    return backend()->allreduce(tensors, options);
  }
  const torch::Tensor flat = tensor.view({-1});
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(slices.size());
  for (const detail::Slice& slice : slices) {
    std::vector<torch::Tensor> part{flat.narrow(0, slice.offset, slice.numel)};
    works.push_back(backend()->allreduce(part, options));
  }
  return c10::make_intrusive<detail::SlicedWork>(std::move(works), tensor);
}

void ProcessGroup::allreduce(torch::Tensor& tensor, c10d::ReduceOp op, const char* what) {
  if (auto* hierarchical = hierarchical_for(tensor, op)) {
    const auto seq = begin_collective("allreduce", what, -1, &tensor, "hierarchical");
    wait_collective(seq, start_collective(seq, what, [&] {
      return hierarchical->allreduce(tensor, op, hierarchical_context(seq, what, tensor));
    }), what, state_->info.timeout);
    return;
  }
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  const auto seq = begin_collective("allreduce", what, -1, &tensor);
  wait_collective(seq, start_collective(seq, what, [&] { return start_flat_allreduce(tensor, options); }), what,
                  state_->info.timeout, detail::cuda::wait_mode(state_->info.backend_name, tensor.device()));
}

void ProcessGroup::broadcast(torch::Tensor& tensor, int src, const char* what) {
  if (auto* hierarchical = hierarchical_for(tensor); hierarchical != nullptr && src >= 0 && src < state_->info.size) {
    const auto seq = begin_collective("broadcast", what, -1, &tensor, "hierarchical");
    wait_collective(seq, start_collective(seq, what, [&] {
      return hierarchical->broadcast(tensor, src, hierarchical_context(seq, what, tensor));
    }), what, state_->info.timeout);
    return;
  }
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = src;
  const auto seq = begin_collective("broadcast", what, -1, &tensor);
  wait_collective(seq, start_collective(seq, what, [&] { return backend()->broadcast(tensors, options); }), what,
                  state_->info.timeout, detail::cuda::wait_mode(state_->info.backend_name, tensor.device()));
}

std::vector<torch::Tensor> ProcessGroup::allgather(const torch::Tensor& tensor, const char* what) {
  std::vector<torch::Tensor> inputs{tensor.contiguous()};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int r = 0; r < state_->info.size; ++r) outputs[0].push_back(torch::empty_like(inputs[0]));
  if (auto* hierarchical = hierarchical_for(inputs[0])) {
    const auto seq = begin_collective("allgather", what, -1, &inputs[0], "hierarchical");
    wait_collective(seq, start_collective(seq, what, [&] {
      return hierarchical->allgather(inputs[0], outputs[0], hierarchical_context(seq, what, inputs[0]));
    }), what, state_->info.timeout);
    return outputs[0];
  }
  const auto seq = begin_collective("allgather", what, -1, &inputs[0]);
  wait_collective(seq, start_collective(seq, what, [&] { return backend()->allgather(outputs, inputs); }), what,
                  state_->info.timeout, detail::cuda::wait_mode(state_->info.backend_name, inputs[0].device()));
  return outputs[0];
}

// Note [SIGPIPE in a rank]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo writes to its peers' sockets without MSG_NOSIGNAL. When another host goes away, a rank's
// next write to it raises SIGPIPE, whose default action ends the rank at once: no error file, no
// failed collective, only "exitcode SIGPIPE" in the summary (seen in hosts.host_kill, where a rank
// on a surviving host died so). Python ignores SIGPIPE at start-up, so PyTorch's ranks get the
// write's EPIPE and Gloo's "Connection reset by peer" instead; a C++ rank does the same here. Only
// the default action is replaced: a handler the program installed stays. (ddp_launch resets
// SIGPIPE to the default in each worker, as Python's subprocess does, so the rank decides.)
static void ignore_default_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  ignore_default_sigpipe();  // See Note [SIGPIPE in a rank]
  install_uncaught_exception_handler();  // See Note [Uncaught exceptions in a worker]
  const EnvLookup env = process_environment();
  const InitMethod method = parse_init_method(options.init_method);
  if (options.timeout.count() <= 0) throw InvalidArgument("InitOptions::timeout must be positive");
  const milliseconds join_timeout = options.join_timeout ? *options.join_timeout : detail::join_timeout_from_environment(env);
  if (join_timeout.count() <= 0) throw InvalidArgument("InitOptions::join_timeout must be positive");
  if (options.wait_notice_interval.count() <= 0) {
    throw InvalidArgument("InitOptions::wait_notice_interval must be positive");
  }

  ProcessGroup::Info info;
  info.timeout = options.timeout;
  info.log_dir = diagnostics_dir(env);
  info.allreduce_slice_bytes = options.allreduce_slice_bytes
                                   ? checked_slice_bytes(*options.allreduce_slice_bytes, "InitOptions")
                                   : detail::allreduce_slice_bytes_from_environment(env);
  std::string host;
  int port = 0;
  std::optional<WorkerEnvironment> launch_env;  // env://: where rank and size came from, logged below
  if (method.kind == InitMethod::Kind::kEnv) {
    const WorkerEnvironment& launch = launch_env.emplace(parse_worker_environment(env, options.rank, options.world_size));
    info.rank = launch.rank;
    info.size = launch.world_size;
    info.local_rank = launch.local_rank;
    info.local_size = launch.local_world_size;
    host = launch.master_addr;
    port = launch.master_port;
  } else {
    if (options.rank < 0 || options.world_size < 1) {
      throw InvalidArgument(str("init_method ", options.init_method,
                                " needs an explicit rank and world_size (InitOptions::rank and "
                                "InitOptions::world_size); got rank=", options.rank, ", world_size=",
                                options.world_size));
    }
    if (options.rank >= options.world_size) {
      throw InvalidArgument(str("rank ", options.rank, " is not below world_size ", options.world_size));
    }
    info.rank = options.rank;
    info.size = options.world_size;
    const LocalPlacement local = parse_local_placement(env, info.rank, info.size);
    info.local_rank = local.local_rank;
    info.local_size = local.local_world_size;
    host = method.kind == InitMethod::Kind::kTcp ? method.host : std::string("127.0.0.1");
    port = method.port;
  }

  std::string backend = options.backend;
  if (backend == "auto") backend = nccl_available() ? "nccl" : "gloo";
  if (backend != "gloo" && backend != "nccl") {
    throw InvalidArgument(str("unknown backend '", options.backend, "': use gloo, nccl or auto"));
  }
  if (backend == "nccl" && !nccl_available()) {
    throw InvalidArgument(
        "backend nccl is not available: this LibTorch has no c10d NCCL support or no CUDA device "
        "is visible; use backend gloo (or auto)");
  }
  info.backend_name = backend;
  // See Note [Device of a rank] in ddp/runtime/detail/cuda_support.h and Note [NCCL error handling] in its .cpp.
  std::optional<detail::cuda::NcclSettings> nccl_settings;
  if (backend == "nccl") nccl_settings = detail::cuda::parse_nccl_settings(env);
  info.device = backend == "nccl" ? detail::cuda::bind_local_device(info.local_rank, info.local_size, env)
                                  : torch::Device(torch::kCPU);
  Logger logger = Logger::for_rank(info.rank);
  // See Note [Launch sources] in ddp/base/worker_variables.cpp: said once (rank 0), at info level unless a
  // launcher (ddp_launch, torchrun) set the variables.
  if (launch_env && info.rank == 0) {
    logger.log(launch_env->launch_source == LaunchSource::kLauncher ? LogLevel::kDebug : LogLevel::kInfo,
               launch_env->description);
  }
  if (backend != "nccl" && detail::cuda::device_count() > 0) {
    // Unchanged user code's torch::Device(torch::kCUDA) lands on this rank's GPU with Gloo too (See
    // Note [Device of a rank]); more ranks than GPUs is fine for Gloo: they stay on the default one.
    try {
      detail::cuda::bind_local_device(info.local_rank, info.local_size, env);
    } catch (const InvalidArgument& error) {
      logger.debug(str("no CUDA device bound: ", error.what()));
    }
  }
  set_threads_per_rank(env, info.local_size, logger);

  const bool peers_on_other_hosts = info.size > info.local_size;
  info.spans_hosts = peers_on_other_hosts;
  const bool alone = launch_env && launch_env->launch_source == LaunchSource::kNone && info.size == 1;
  const JoinWait join{join_timeout, options.wait_notice_interval,
                      method.kind == InitMethod::Kind::kFile ? method.path : str(host, ":", port), &logger};
  auto base_store =
      alone ? c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>())  // alone: no port
            : make_store(method, host, port, info.rank, info.size, info.timeout, peers_on_other_hosts, join);
  check_world_size(*base_store, info.rank, info.size, join);
  auto store = c10::make_intrusive<c10d::PrefixStore>("ddp/default_pg", base_store);

  c10::intrusive_ptr<c10d::Backend> pg;
  try {
    if (backend == "gloo") {
      // See Note [Advertised address] in ddp/base/detail/route.h.
      detail::AdvertiseOptions advertise;
      advertise.peers_on_other_hosts = peers_on_other_hosts;
      advertise.socket_ifname = env("GLOO_SOCKET_IFNAME");
      pg = make_gloo_backend(store, info, detail::choose_advertised_address(detail::look_up_route(host), advertise));
    } else {
#ifdef USE_C10D_NCCL
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create(/*is_high_priority_stream=*/false);
      nccl_options->timeout = info.timeout;  // the watchdog's bound for every collective
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, info.rank, info.size, nccl_options);
      logger.debug(str("NCCL on ", info.device.str(), ", TORCH_NCCL_ASYNC_ERROR_HANDLING=",
                       nccl_settings->async_error_handling, ", blocking wait ", nccl_settings->blocking_wait,
                       nccl_settings->nccl_variables.empty() ? "" : ", " + nccl_settings->nccl_variables));
#endif
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    rethrow_as_ddp(error, str("rank ", info.rank, " could not set up the ", backend, " backend with ",
                              info.size, " ranks (timeout ", detail::seconds_of(info.timeout), " s)"));
  }
  logger.debug(str("process group ready: backend ", backend, ", rank ", info.rank, " of ", info.size,
                   ", local rank ", info.local_rank, " of ", info.local_size));
  return std::make_shared<ProcessGroup>(std::move(info), base_store, std::move(pg));
}

std::shared_ptr<ProcessGroup> new_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                                const StoreGroupOptions& options) {
  if (!store) throw InvalidArgument("new_process_group: the store is null");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument(str("new_process_group: rank ", rank, " and world_size ", world_size,
                              " do not fit (need 0 <= rank < world_size)"));
  }
  if (options.timeout.count() <= 0) throw InvalidArgument("StoreGroupOptions::timeout must be positive");
  ignore_default_sigpipe();  // See Note [SIGPIPE in a rank]: a lost peer must give PeerLostError, not kill
  if (options.backend != "gloo") {
    throw InvalidArgument(str("new_process_group: backend '", options.backend,
                              "' is not supported over a given store: use gloo (init_process_group sets up nccl)"));
  }
  ProcessGroup::Info info;
  info.rank = rank;
  info.size = world_size;
  info.local_rank = rank;
  info.local_size = world_size;
  info.backend_name = options.backend;
  info.timeout = options.timeout;
  info.log_dir = options.log_dir;
  info.host_identity = options.host_identity;
  info.allreduce_slice_bytes = checked_slice_bytes(options.allreduce_slice_bytes, "StoreGroupOptions");
  info.spans_hosts = options.spans_hosts;
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("ddp/group", store);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = make_gloo_backend(prefixed, info, detail::AdvertisedAddress{{}, options.host});
  } catch (const std::exception& error) {
    rethrow_as_ddp(error, str("rank ", rank, " could not set up the gloo backend with ", world_size,
                              " ranks over the given store (timeout ", detail::seconds_of(options.timeout), " s)"));
  }
  return std::make_shared<ProcessGroup>(std::move(info), std::move(store), std::move(backend));
}

void ProcessGroup::exchange(std::vector<Transfer>& sends, std::vector<Transfer>& receives, const char* what) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::vector<torch::Tensor>> buffers;  // c10d takes them by reference: alive until waited for
  buffers.reserve(sends.size() + receives.size());
  try {
    for (auto& t : sends) {
      buffers.push_back({t.tensor});
      works.push_back(backend()->send(buffers.back(), t.peer, t.tag));
    }
    for (auto& t : receives) {
      buffers.push_back({t.tensor});
      works.push_back(backend()->recv(buffers.back(), t.peer, t.tag));
    }
  } catch (const std::exception& error) {
    fail_collective(0, what, state_->info.timeout, &error);
  }
  // Unrecorded (seq 0): the collective log's arrival check is for calls every rank makes. Not waited
  // for in slices as collectives are (abort() is not polled): a send or receive work of c10d's Gloo
  // completes with an error when one wait of it times out, so each gets the whole timeout. A peer
  // gone closes its pair, which fails the wait at once; abort() is seen before the next work.
  const milliseconds timeout = state_->info.timeout;
  for (const auto& work : works) {
    if (state_->aborted.load()) {
      std::lock_guard<std::mutex> lock(state_->abort_mutex);
      throw PeerLostError(str(what, " on rank ", global_rank(state_->info.rank), ": the process group was aborted",
                              state_->abort_reason.empty() ? "" : ": ", state_->abort_reason));
    }
    try {
      if (!work->wait(timeout)) fail_collective(0, what, timeout, nullptr);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      fail_collective(0, what, timeout, &error);
    }
  }
}

void ProcessGroup::broadcast_bytes(std::string& bytes, int src, const char* what) {
  torch::Tensor length = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64).to(state_->info.device);
  broadcast(length, src, what);
  const int64_t size = length.cpu().item<int64_t>();
  if (size < 0) throw CommunicationError(str(what, ": rank ", src, " announced ", size, " bytes"));
  torch::Tensor payload = torch::empty({size}, torch::kUInt8);
  if (state_->info.rank == src && size > 0) std::memcpy(payload.data_ptr(), bytes.data(), bytes.size());
  payload = payload.to(state_->info.device);
  broadcast(payload, src, what);
  if (state_->info.rank != src) {
    payload = payload.cpu();
    bytes.assign(static_cast<const char*>(payload.data_ptr()), static_cast<size_t>(size));
  }
}

}  // namespace ddp
