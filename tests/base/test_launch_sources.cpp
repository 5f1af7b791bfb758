// Where a directly started binary learns its rank (See Note [Launch sources] in
// ddp/base/worker_variables.cpp): ddp_launch/torchrun, srun, mpirun (OpenMPI), mpiexec (PMI), nothing.
#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "ddp/base/worker_variables.h"
#include "ddp/base/error.h"

using ddp::LaunchSource;
using ddp::WorkerEnvironment;

namespace {

WorkerEnvironment parse(std::map<std::string, std::string> vars) {
  return ddp::parse_worker_environment(ddp::EnvironmentSnapshot::from_map(std::move(vars)).lookup());
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    parse(std::move(vars));
  } catch (const ddp::InvalidArgument& error) {
    return error.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("no launcher variables at all: rank 0 of a world of size 1", "[launch_sources]") {
  const auto alone = parse({{"PATH", "/usr/bin"}, {"HOME", "/root"}});
  CHECK(alone.launch_source == LaunchSource::kNone);
  CHECK(alone.source == "none");
  CHECK(alone.rank == 0);
  CHECK(alone.world_size == 1);
  CHECK(alone.local_rank == 0);
  CHECK(alone.local_world_size == 1);
  CHECK(alone.master_port == 0);  // no store port needed
  CHECK_THAT(alone.description, Catch::Contains("world of size 1"));
  // Explicit arguments for more than one rank still need a master.
  CHECK_THROWS_WITH(ddp::parse_worker_environment(ddp::EnvironmentSnapshot::from_map({}).lookup(), 0, 2),
                    Catch::Contains("MASTER_ADDR is not set"));
}

TEST_CASE("a Slurm batch script without srun is not a rank of the allocation", "[launch_sources]") {
  const auto batch = parse({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "host[0-2]"},
                            {"SLURM_JOB_ID", "5"}});
  CHECK(batch.launch_source == LaunchSource::kNone);
  CHECK(batch.world_size == 1);
}

TEST_CASE("a partial set is an error, never a world of size 1", "[launch_sources]") {
  CHECK_THAT(error_of({{"RANK", "0"}}), Catch::Contains("WORLD_SIZE is not set but RANK is"));
  CHECK_THAT(error_of({{"WORLD_SIZE", "2"}}), Catch::Contains("RANK is not set but WORLD_SIZE is"));
  CHECK_THAT(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}}), Catch::Contains("SLURM_NTASKS is not set"));
  CHECK_THAT(error_of({{"OMPI_COMM_WORLD_SIZE", "2"}}), Catch::Contains("OMPI_COMM_WORLD_RANK is not set"));
  CHECK_THAT(error_of({{"PMI_RANK", "1"}}), Catch::Contains("PMI_SIZE is not set"));
}

TEST_CASE("srun: SLURM_* with the master from the node list and the job id", "[launch_sources]") {
  const auto w = parse({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                        {"SLURM_NNODES", "3"}, {"SLURM_TASKS_PER_NODE", "2(x3)"},
                        {"SLURM_JOB_NODELIST", "node[07-09]"}, {"SLURM_JOB_ID", "123456"}});
  CHECK(w.launch_source == LaunchSource::kSlurm);
  CHECK(w.rank == 4);
  CHECK(w.world_size == 6);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 2);
  CHECK(w.group_rank == 2);
  CHECK(w.group_world_size == 3);
  CHECK(w.master_addr == "node07");
  CHECK(w.master_port == 10000 + 123456 % 50000);
  CHECK(w.master_port == ddp::slurm_default_port(123456));
  CHECK_THAT(w.description, Catch::Contains("SLURM_PROCID=4") && Catch::Contains("SLURM_JOB_NODELIST"));
  // MASTER_ADDR / MASTER_PORT win; uneven tasks per node.
  const auto set = parse({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_NODEID", "1"},
                          {"SLURM_TASKS_PER_NODE", "2,1"}, {"SLURM_JOB_NODELIST", "a,b"}, {"SLURM_JOB_ID", "7"},
                          {"MASTER_ADDR", "head"}, {"MASTER_PORT", "4321"}});
  CHECK(set.master_addr == "head");
  CHECK(set.master_port == 4321);
  CHECK(set.local_world_size == 1);
  CHECK_THAT(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a"}}),
             Catch::Contains("MASTER_PORT is not set"));
  CHECK_THAT(error_of({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-"},
                       {"SLURM_JOB_ID", "1"}}),
             Catch::Contains("malformed Slurm host list"));
}

TEST_CASE("mpirun (OpenMPI) and mpiexec (PMI): the master from MASTER_ADDR/MASTER_PORT", "[launch_sources]") {
  const auto ompi = parse({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                           {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "29511"}});
  CHECK(ompi.launch_source == LaunchSource::kOpenMpi);
  CHECK(ompi.source == "openmpi");
  CHECK(ompi.rank == 3);
  CHECK(ompi.world_size == 4);
  CHECK(ompi.local_rank == 1);
  CHECK(ompi.local_world_size == 2);
  CHECK(ompi.master_addr == "h0");
  CHECK(ompi.master_port == 29511);
  const auto pmi = parse({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"},
                          {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "29511"}});
  CHECK(pmi.launch_source == LaunchSource::kPmi);
  CHECK(pmi.rank == 1);
  CHECK(pmi.world_size == 2);
  CHECK(pmi.local_rank == 0);
  CHECK(pmi.local_world_size == 1);
  CHECK_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("MASTER_ADDR is not set") && Catch::Contains("mpirun -x MASTER_ADDR"));
  CHECK_THAT(error_of({{"PMI_RANK", "2"}, {"PMI_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("PMI_RANK=2 is not below PMI_SIZE=2"));
}

TEST_CASE("launch sources: an agent wins, MPI wins over Slurm, anything else must agree", "[launch_sources]") {
  const std::map<std::string, std::string> master = {{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}};
  auto with = [&](std::map<std::string, std::string> vars) {
    vars.insert(master.begin(), master.end());
    return vars;
  };
  // ddp_launch under srun: its workers inherit the launcher's SLURM_PROCID (the node).
  const auto agent = parse(with({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"TORCHELASTIC_RUN_ID", "j"},
                                 {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"OMPI_COMM_WORLD_RANK", "0"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"}}));
  CHECK(agent.launch_source == LaunchSource::kLauncher);
  CHECK(agent.rank == 5);
  // mpirun inside an allocation: its ranks inherit the srun'd daemon's SLURM_PROCID.
  const auto mpi_in_slurm = parse(with({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                        {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}));
  CHECK(mpi_in_slurm.launch_source == LaunchSource::kOpenMpi);
  CHECK(mpi_in_slurm.rank == 3);
  // Agreeing sources are fine (a PyTorchJob-style RANK next to srun's, say).
  CHECK(parse(with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}})).rank == 1);
  // Disagreeing: an error naming both.
  CHECK_THAT(error_of(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                            {"OMPI_COMM_WORLD_SIZE", "2"}})),
             Catch::Contains("conflicting launch sources: torchrun says RANK=0, WORLD_SIZE=2 but openmpi says "
                             "OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2"));
  CHECK_THAT(error_of(with({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}})),
             Catch::Contains("torchrun says") && Catch::Contains("slurm says SLURM_PROCID=0, SLURM_NTASKS=3"));
  CHECK_THAT(error_of(with({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"PMI_RANK", "0"}, {"PMI_SIZE", "2"}})),
             Catch::Contains("pmi says PMI_RANK=0"));
  CHECK_THAT(error_of(with({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"PMI_RANK", "1"},
                            {"PMI_SIZE", "2"}})),
             Catch::Contains("openmpi says") && Catch::Contains("pmi says"));
}
