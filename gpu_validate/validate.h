// `meshsim validate`: a scenario on a real engine, compared with the simulation.
//
// The coordinator (no --rank) runs the simulation once (an illegal scenario stops there, exit 3;
// a --fault that would inject nothing, exit 2), writes the document it read into the workers'
// directory, starts one worker process of meshsim per rank of the mesh on this machine (each runs
// that copy, never the path again), watches them, gathers the verdict each writes, and prints them. A worker (--rank R) runs the scenario on the engine as
// rank R (real_engine.h), runs it again on the simulation, and compares its rank's local of every
// value and input gradient: bit for bit when every sum the engine made was over integers (the
// default data), within a stated tolerance otherwise. Workers started by hand on several machines
// meet through a TCP store (--master-addr, --master-port) and each prints its own verdict.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/scenario.h"

namespace meshsim {

// Exit codes beyond contract 1's 0-3 (DESIGN.md): a worker died, hung or its engine failed; the
// engine cannot run on this machine (no GPU, too few GPUs), reported and skipped.
constexpr int kExitEngineFailure = 4;
constexpr int kExitEngineSkipped = 5;

struct ValidateConfig {
  std::string file;                 // the scenario file, read once, by the coordinator
  std::string backend = "gloo";     // gloo | nccl
  int64_t ranks = 0;                // 0: the mesh's size
  std::vector<std::string> options; // --option key=value, passed on to workers
  double timeout_s = 30;            // every collective and rendezvous; and the watchdog
  std::string fault;                // kill|hang|stop|corrupt:RANK:AT (testing)
  bool json = false;
  bool keep = false;                // keep the workers' directory (its path is printed); else removed
                                    // whichever way the run ends
  // Worker mode.
  int64_t rank = -1;
  std::string store;                // FileStore path
  std::string master_addr;          // or TCPStore address and port
  int master_port = 29500;
  std::string hostname;             // the address this worker listens on
  std::string result_file;          // where the worker writes its verdict (JSON)
  std::string progress_file;        // a line per wait entered and left, its mtime the heartbeat
  std::string scenario_copy;        // the document the coordinator read and checked, which a worker
                                    // runs instead of re-reading `file` (then only its name)
};

// Why the backend cannot run `world` ranks here, or "" when it can.
std::string engine_unavailable(const std::string& backend, int64_t world);

// Worker: validates one rank; prints its verdict, writes it to result_file, returns its exit code.
int validate_worker(const Scenario& sc, const RunOptions& options, const ValidateConfig& config, std::ostream& out);

// Coordinator: starts the workers (this executable again, as workers), returns the exit code.
int validate_coordinator(const Scenario& sc, const RunOptions& options, const ValidateConfig& config, std::ostream& out);

// The path of the running executable (/proc/self/exe), which starts its own workers.
std::string self_executable();

}  // namespace meshsim
