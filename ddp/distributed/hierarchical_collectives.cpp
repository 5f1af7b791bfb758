#include "ddp/distributed/hierarchical_collectives.h"

#include <algorithm>
#include <utility>

#include "ddp/base/error.h"
#include "ddp/base/str.h"
#include "ddp/distributed/process_group.h"

namespace ddp {
namespace {

// The same failure, its message prefixed with the collective of the parent group it belongs to.
std::exception_ptr in_context(const std::string& context) {
  try {
    throw;
  } catch (const TimeoutError& error) {
    return std::make_exception_ptr(TimeoutError(str(context, ": ", error.what())));
  } catch (const PeerLostError& error) {
    return std::make_exception_ptr(PeerLostError(str(context, ": ", error.what())));
  } catch (const std::exception& error) {
    return std::make_exception_ptr(CommunicationError(str(context, ": ", error.what())));
  }
}

// A work completed by the worker thread. Its wait() allows a few seconds beyond the caller's
// timeout: each stage is bounded by the same timeout and, when it runs out, spends up to ~3 s naming
// the ranks that did not arrive (Note [Naming the ranks that did not arrive]); that report, naming
// the sub-group, is what the caller should get, not a bare timeout of its own.
class StagedWork : public c10d::Work {
 public:
  explicit StagedWork(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  bool wait(std::chrono::milliseconds timeout) override {
    const auto bound = timeout == std::chrono::milliseconds(0) ? timeout_ : timeout;
    return c10d::Work::wait(bound + kDiagnosisSlack);
  }
  void complete(std::exception_ptr error) { finish(std::move(error)); }

 private:
  static constexpr std::chrono::milliseconds kDiagnosisSlack{5000};
  std::chrono::milliseconds timeout_;
};

// A contiguous one-dimensional view of `tensor`, or a contiguous copy to be written back.
torch::Tensor flat_of(const torch::Tensor& tensor) { return tensor.contiguous().view(-1); }

void write_back(torch::Tensor& tensor, const torch::Tensor& flat) {
  if (flat.data_ptr() != tensor.data_ptr() || !tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
}

}  // namespace

HierarchicalCollectives::HierarchicalCollectives(Topology topology, int rank, std::shared_ptr<ProcessGroup> intra,
                                                 std::shared_ptr<ProcessGroup> inter,
                                                 std::chrono::milliseconds timeout)
    : topology_(std::move(topology)),
      rank_(rank),
      local_rank_(topology_.local_rank_of_rank.at(static_cast<std::size_t>(rank))),
      intra_(std::move(intra)),
      inter_(std::move(inter)),
      timeout_(timeout),
      worker_([this] { run_worker(); }) {}

HierarchicalCollectives::~HierarchicalCollectives() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  // Queued stages still run (each bounded by the timeout): their works must complete.
  worker_.join();
}

void HierarchicalCollectives::run_worker() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

c10::intrusive_ptr<c10d::Work> HierarchicalCollectives::submit(std::function<void()> stages, std::string context) {
  auto work = c10::make_intrusive<StagedWork>(timeout_);
  auto task = [work, stages = std::move(stages), context = std::move(context)] {
    std::exception_ptr error;
    try {
      stages();
    } catch (...) {
      error = in_context(context);
    }
    work->complete(error);
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Error(str("rank ", rank_, ": the process group was destroyed"));
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> HierarchicalCollectives::allreduce(torch::Tensor tensor, c10d::ReduceOp op,
                                                                  std::string context) {
  return submit([this, tensor, op]() mutable { allreduce_stages(tensor, op); }, std::move(context));
}

c10::intrusive_ptr<c10d::Work> HierarchicalCollectives::broadcast(torch::Tensor tensor, int src, std::string context) {
  return submit([this, tensor, src]() mutable { broadcast_stages(tensor, src); }, std::move(context));
}

c10::intrusive_ptr<c10d::Work> HierarchicalCollectives::allgather(torch::Tensor tensor, std::vector<torch::Tensor> outputs,
                                                                  std::string context) {
  return submit([this, tensor, outputs = std::move(outputs)]() mutable { allgather_stages(tensor, outputs); },
                std::move(context));
}

void HierarchicalCollectives::allreduce_stages(torch::Tensor& tensor, c10d::ReduceOp op) {
  const std::int64_t n = tensor.numel();
  if (n == 0) return;
  const std::int64_t local_size = topology_.ranks_per_host();
  const auto flat = flat_of(tensor);
  // Shards of equal size: the buffer is padded to a multiple of the ranks per host (the padding
  // is reduced too and dropped).
  const std::int64_t shard_numel = (n + local_size - 1) / local_size;
  auto padded = flat;
  if (shard_numel * local_size != n) {
    padded = torch::zeros({shard_numel * local_size}, flat.options());
    padded.narrow(0, 0, n).copy_(flat);
  }
  // See Note [Pipelined stages]: chunks of `chunk_shard` elements per local rank.
  const std::int64_t chunk_shard =
      std::max<std::int64_t>(1, kPipelineChunkBytes / static_cast<std::int64_t>(flat.element_size()) / local_size);
  struct Chunk {
    torch::Tensor block, shard;
    c10::intrusive_ptr<c10d::Work> scattered, reduced, gathered;
  };
  std::vector<Chunk> chunks;
  for (std::int64_t begin = 0; begin < shard_numel; begin += chunk_shard) {
    const std::int64_t length = std::min(chunk_shard, shard_numel - begin);
    Chunk chunk;
    chunk.block = padded.narrow(0, begin * local_size, length * local_size);
    chunk.shard = torch::empty({length}, flat.options());
    chunks.push_back(std::move(chunk));
  }
  const char* const scatter_what = "hierarchical reduce-scatter in the host";
  const char* const reduce_what = "hierarchical all-reduce across hosts";
  const char* const gather_what = "hierarchical all-gather in the host";
  chunks[0].scattered = intra_->reduce_scatter_tensor_async(chunks[0].shard, chunks[0].block, op, scatter_what);
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    intra_->wait(chunks[c].scattered, scatter_what);
    chunks[c].reduced = inter_->allreduce_async(chunks[c].shard, op, reduce_what);
    if (c + 1 < chunks.size()) {
      chunks[c + 1].scattered =
          intra_->reduce_scatter_tensor_async(chunks[c + 1].shard, chunks[c + 1].block, op, scatter_what);
    }
    inter_->wait(chunks[c].reduced, reduce_what);
    chunks[c].gathered = intra_->allgather_into_tensor_async(chunks[c].block, chunks[c].shard, gather_what);
  }
  for (auto& chunk : chunks) intra_->wait(chunk.gathered, gather_what);
  if (padded.data_ptr() != flat.data_ptr()) flat.copy_(padded.narrow(0, 0, n));
  write_back(tensor, flat);
}

void HierarchicalCollectives::broadcast_stages(torch::Tensor& tensor, int src) {
  if (tensor.numel() == 0) return;
  auto flat = flat_of(tensor);
  const int src_local_rank = topology_.local_rank_of_rank.at(static_cast<std::size_t>(src));
  const int src_host = topology_.host_of_rank.at(static_cast<std::size_t>(src));
  if (local_rank_ == src_local_rank) inter_->broadcast(flat, src_host, "hierarchical broadcast across hosts");
  intra_->broadcast(flat, src_local_rank, "hierarchical broadcast in the host");
  write_back(tensor, flat);
}

void HierarchicalCollectives::allgather_stages(const torch::Tensor& tensor, std::vector<torch::Tensor>& outputs) {
  if (tensor.numel() == 0) return;
  const auto flat = flat_of(tensor);
  // Across hosts among the ranks with this local rank: one tensor per host, by host index.
  const auto block = torch::stack(inter_->allgather(flat, "hierarchical all-gather across hosts"));
  auto gathered = torch::empty({topology_.ranks_per_host(), topology_.hosts(), flat.numel()}, flat.options());
  auto gathered_flat = gathered.view(-1);
  intra_->allgather_into_tensor(gathered_flat, block.view(-1), "hierarchical all-gather in the host");
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    outputs[r].copy_(gathered[topology_.local_rank_of_rank[r]][topology_.host_of_rank[r]].view(outputs[r].sizes()));
  }
}

}  // namespace ddp
