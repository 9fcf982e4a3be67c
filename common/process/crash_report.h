// Crash reports for the daemons: a process killed by a fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE)
// or by abort() (SIGABRT: failed assertions, std::terminate) writes one line naming the signal
// and its thread, then the native stack of the faulting thread, to stderr, and then dies of the
// same signal as it would have without the report (exit status, core dump and all).
//
// Why: a daemon that dies of a fault otherwise leaves nothing in its log, and a test or an
// operator sees only a worker that went silent.
//
// Contract: InstallCrashReport is called once, early in main (before threads start, so that the
// first backtrace's lazy loading of libgcc happens outside a signal handler). The handler uses
// only async-signal-safe calls after that (write, backtrace_symbols_fd, raise), runs on an
// alternate stack in the thread that installed it (so a stack overflow there is reported too),
// and reports only the first fault: a second thread faulting meanwhile dies of its signal
// directly. Termination signals (SIGTERM, SIGINT) are not touched.
#pragma once

namespace stagecoach {

// `program` names the process in the report ("stagecoach-worker"); it must outlive the process.
void InstallCrashReport(const char* program);

}  // namespace stagecoach
