#pragma once
// The whole public API in one include: `#include <ddp/ddp.h>` (or "ddp/ddp.h"). Every public
// header, by folder (Note [Library folders] in ddp/CMakeLists.txt); the package test checks that
// each public type is reachable through this include alone.
//   process groups      ddp::init_process_group, ddp::ProcessGroup          ddp/distributed/
//   data parallelism    ddp::DistributedDataParallel, ddp::DataParallel,    ddp/parallel/
//                       ddp::SyncBatchNorm
//   communication hooks CommHookInterface, PowerSGD, model averaging       ddp/algorithms/
//   mixed precision     ddp::amp::AutocastScope, ddp::amp::GradScaler       ddp/amp/
//   ZeRO-1              ddp::ZeroRedundancyOptimizer                        ddp/optim/
//   checkpoints         ddp::save_checkpoint, ddp::load_checkpoint, ...     ddp/checkpoint/
//   fault tolerance     ddp::FaultTolerant, ddp::StoreMembership, LiveJob   ddp/elastic/
//   a worker's main     ddp::run_main, ddp::ProgressReporter, ddp::Logger   ddp/runtime/
//   errors, the worker's variables                                         ddp/base/
//   data                ddp::DistributedSampler (= ddp::samplers::...)      samplers/
// The per-concept headers stay includable on their own.
#include "ddp/algorithms/comm.h"
#include "ddp/algorithms/comm_hook_state.h"
#include "ddp/algorithms/default_comm_hooks.h"
#include "ddp/algorithms/diloco.h"
#include "ddp/algorithms/model_averaging.h"
#include "ddp/algorithms/powersgd.h"
#include "ddp/amp/autocast.h"
#include "ddp/amp/grad_scaler.h"
#include "ddp/base/error.h"
#include "ddp/base/worker_variable_names.h"
#include "ddp/base/worker_variables.h"
#include "ddp/checkpoint/checkpoint.h"
#include "ddp/distributed/hierarchical_collectives.h"
#include "ddp/distributed/process_group.h"
#include "ddp/elastic/fault_tolerant.h"
#include "ddp/elastic/live_job.h"
#include "ddp/elastic/membership.h"
#include "ddp/optim/zero_redundancy_optimizer.h"
#include "ddp/parallel/data_parallel.h"
#include "ddp/parallel/ddp_stats.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "ddp/parallel/sync_batch_norm.h"
#include "ddp/runtime/agent_channel.h"
#include "ddp/runtime/log.h"
#include "ddp/runtime/run_main.h"
#include "ddp/runtime/version.h"
#include "samplers/distributed_sampler.h"
#include "samplers/reshard.h"

namespace ddp {

// The sampler under the names Python users know (torch.utils.data.distributed.DistributedSampler).
using samplers::DistributedSampler;
using samplers::DistributedSamplerOptions;
using samplers::SamplerState;

}  // namespace ddp
