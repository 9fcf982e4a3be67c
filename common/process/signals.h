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

// Ignores SIGPIPE in the whole process, once. Any process that writes to sockets its peers may
// close calls it before its first write: gloo's TCP transport writes with writev, which raises
// SIGPIPE on a connection the peer closed, and the default action ends the process (a test
// binary that stops one in-process rank, or a library user's own program) where the transport
// would have reported EPIPE as a "connection closed" error.
void IgnoreSigpipe();

// Waits until SIGINT or SIGTERM arrives; returns which.
int WaitForTerminationSignal(const sigset_t& signals);

}  // namespace stagecoach
