// `stagectl schedule`: generate, lower, validate, simulate and print pipeline schedules without a
// cluster, or check a schedule CSV a user wrote or PyTorch dumped.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

namespace stagecoach::client {

// The command line of `stagectl schedule`, as parsed (values are checked by RunSchedule).
struct ScheduleCommandOptions {
  // Exactly one of `kind` (generate) and `csv_path` (read a file) is set.
  std::string kind;
  std::string csv_path;

  // Generate mode.
  int ranks = 0;
  int microbatches = 0;
  // Default: 2 for the multi-stage kinds (PyTorch's visualiser default), 1 otherwise.
  std::optional<int> stages_per_rank;
  // GPipe and 1F1B: print the time-aligned list (idle slots kept, no REDUCE_GRAD), the golden
  // `.compute_raw.csv` form.
  bool time_aligned = false;

  // Generate mode: the output, grid|csv|json|chrome (default grid). CSV mode: the file's format,
  // compute_only|compute_comms (default compute_only).
  std::string format;
  // CSV mode: the output, grid|csv|json|chrome (default grid).
  std::string emit;

  // Print the lowered (compute + comms) list rather than the compute list.
  bool lowered = false;
  // Lowering: UNSHARD/RESHARD window; 0 leaves the pass out.
  int max_active_stages = 3;
  // Lowering as a job with placement.shard: parameters and this placement.unshard ("step" or
  // "stage") lowers: replaces max_active_stages, and the lowered lists are validated as running
  // on sharded parameters. Empty: max_active_stages, unvalidated pairing.
  std::string unshard;
  // CSV mode: print only a one-line verdict.
  bool validate = false;

  // Simulate the lowered list and print its summary (grid), include it (json), or trace it
  // (chrome, which always simulates).
  bool simulate = false;
  std::string costs = "1,2,1,1";  // F,B,I,W
  double latency = 0;
  double bandwidth = 0;
  double message_bytes = 0;
  // The memory model (memory_model.h), per stage; the received buffers are message_bytes. Any
  // of these above 0 adds each rank's predicted memory to the simulation (a counter track in
  // chrome).
  double activation_bytes = 0;         // what F keeps per microbatch until its backward
  double weight_activation_bytes = 0;  // the part of it W still needs after I
  double static_bytes = 0;             // parameters, gradients and optimizer state

  // Write the output here instead of stdout.
  std::string out_path;
};

// Runs the command. Output goes to `out` (or the --out file), errors to `err`. Returns 0 on
// success, 1 for an invalid schedule or a configuration the schedule refuses, 2 for a usage error.
int RunSchedule(const ScheduleCommandOptions& options, std::ostream& out, std::ostream& err);

}  // namespace stagecoach::client
