// Orderly shutdown of the daemons on SIGINT / SIGTERM: the signals are blocked in every thread
// and received by one, synchronously.
#pragma once

#include <signal.h>

namespace stagecoach {

// Blocks SIGINT and SIGTERM in the calling thread and in the threads it creates afterwards, and
// ignores SIGPIPE in the whole process: a write to a peer that closed its connection (a worker
// thawed after its job was stopped, writing to its former peers) is an error the transport
// reports (EPIPE), not the end of the daemon. Call it in main before starting any thread;
// returns the set to wait on.
sigset_t BlockTerminationSignals();

// Waits until SIGINT or SIGTERM arrives; returns which.
int WaitForTerminationSignal(const sigset_t& signals);

}  // namespace stagecoach
