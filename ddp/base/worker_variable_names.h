#pragma once
// The names of the environment variables of the launcher-worker contract: what ddp_launch (and
// torchrun, and srun) set for a worker, and what a worker reads. The writer is
// launcher/agent/worker_variables.cpp, the reader and validator ddp/base/worker_variables.cpp; nothing else spells
// these names. See Note [Worker environment contract].
namespace ddp::env {

// Note [Worker environment contract]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A worker learns where it sits in the job only from its environment, so the names below are the
// whole interface between ddp_launch and the ddp library: they are torchrun's names (a worker
// started by torchrun runs unchanged) plus three of ours (DDP_AGENT_SOCKET, DDP_LOG_DIR and
// CUDA_DEVICE_ORDER's default). Keeping them in one header means a rename cannot reach one side
// only; the round trip (launcher_variables, then parse_worker_environment) is tested in
// tests/base/test_worker_env_contract.cpp.

// Where the worker sits (torchrun's names).
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupRank[] = "GROUP_RANK";             // the node's rank
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";  // the number of nodes
inline constexpr char kRoleName[] = "ROLE_NAME";  // --role
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
// Rank 0's rendezvous address (env:// init method).
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
// The attempt (torchelastic's names).
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";  // see Note [Error file] in run_main.h
// torchrun's too: the signals the agent forwards (--signals_to_handle), and whether the agent serves
// the store (ddp_launch never does, so it never sets it: a Python rank 0 serves it on MASTER_PORT).
inline constexpr char kSignalsToHandle[] = "TORCHELASTIC_SIGNALS_TO_HANDLE";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr char kTorchNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";  // 1 unless set
// ddp_launch's own: the heartbeat socket (see Note [Agent channel] in ddp/base/agent_message.h) and the attempt's log folder.
inline constexpr char kAgentSocket[] = "DDP_AGENT_SOCKET";
// The rank the heartbeats claim when it is not RANK: a hot spare's, numbered after the world's
// ranks (See Note [Hot spares in ddp_launch] in launcher/agent/plan.cpp).
inline constexpr char kAgentRank[] = "DDP_AGENT_RANK";
inline constexpr char kLogDir[] = "DDP_LOG_DIR";
// How long init_process_group waits to join (seconds): ddp_launch's --rdzv_conf join_timeout (=
// --rdzv_timeout); users may set it by hand. See Note [Waiting is never silent] in ddp/distributed/detail/join_wait.h.
inline constexpr char kJoinTimeout[] = "DDP_JOIN_TIMEOUT";
// The slice size of large CPU all-reduces over Gloo, in bytes (0: not sliced); see Note [Sliced
// all-reduce] in ddp/distributed/detail/sliced_allreduce.cpp. InitOptions::allreduce_slice_bytes wins over it.
inline constexpr char kAllreduceSliceBytes[] = "DDP_ALLREDUCE_SLICE_BYTES";
// ddp_launch --recovery live: where the job's membership lives (See Note [Live recovery with
// ddp_launch] in launcher/agent/live_recovery.cpp): the rendezvous store "HOST:PORT", the job's key prefix in
// it, and this worker's member id (stable for the process's life, unique in the job).
inline constexpr char kLiveStore[] = "DDP_LIVE_STORE";
inline constexpr char kLivePrefix[] = "DDP_LIVE_PREFIX";
inline constexpr char kLiveMember[] = "DDP_LIVE_MEMBER";
// Set (to "1") for a hot spare (ddp_launch --spares): it waits in the job's spare pool until it takes
// a lost worker's place (See Note [Hot spares] in ddp/elastic/membership.h).
inline constexpr char kLiveSpare[] = "DDP_LIVE_SPARE";
// Gloo's interface choice (PyTorch's name): read by a live job's workers (ddp/elastic/live_job.cpp).
inline constexpr char kGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";
// Devices and threads.
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kCudaDeviceOrder[] = "CUDA_DEVICE_ORDER";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";

// Schedulers that start the training binary directly (See Note [Launch sources] in
// ddp/base/worker_variables.cpp). Slurm (srun): a worker uses these when RANK and WORLD_SIZE are unset...
inline constexpr char kSlurmProcId[] = "SLURM_PROCID";                 // -> RANK
inline constexpr char kSlurmNtasks[] = "SLURM_NTASKS";                 // -> WORLD_SIZE
inline constexpr char kSlurmLocalId[] = "SLURM_LOCALID";               // -> LOCAL_RANK
inline constexpr char kSlurmNtasksPerNode[] = "SLURM_NTASKS_PER_NODE";  // -> LOCAL_WORLD_SIZE
inline constexpr char kSlurmTasksPerNode[] = "SLURM_TASKS_PER_NODE";    // "2(x3),1": LOCAL_WORLD_SIZE per node
inline constexpr char kSlurmStepId[] = "SLURM_STEP_ID";  // set in an srun task, not in the batch script
// OpenMPI's mpirun.
inline constexpr char kOmpiRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kOmpiLocalSize[] = "OMPI_COMM_WORLD_LOCAL_SIZE";
// MPICH / Intel MPI (PMI).
inline constexpr char kPmiRank[] = "PMI_RANK";
inline constexpr char kPmiSize[] = "PMI_SIZE";
inline constexpr char kMpiLocalRankId[] = "MPI_LOCALRANKID";
inline constexpr char kMpiLocalNranks[] = "MPI_LOCALNRANKS";
// ... and ddp_launch reads these to place its node in a Slurm allocation.
inline constexpr char kSlurmJobNodelist[] = "SLURM_JOB_NODELIST";
inline constexpr char kSlurmNnodes[] = "SLURM_NNODES";
inline constexpr char kSlurmNodeId[] = "SLURM_NODEID";
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";

}  // namespace ddp::env
