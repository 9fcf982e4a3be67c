#include "common/process/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace stagecoach {
namespace {

constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
constexpr int kMaxFrames = 64;

const char* g_program = "stagecoach";
std::atomic<bool> g_reporting{false};

const char* SignalName(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGILL:
      return "SIGILL";
    case SIGFPE:
      return "SIGFPE";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

void WriteString(const char* s) {
  size_t left = strlen(s);
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, s, left);
    if (n <= 0) return;
    s += n;
    left -= static_cast<size_t>(n);
  }
}

// Decimal digits of `value` into `buf` (at least 21 bytes), NUL-terminated; returns buf.
char* FormatNumber(long value, char* buf) {
  char digits[21];
  int n = 0;
  unsigned long v = value < 0 ? -static_cast<unsigned long>(value) : value;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  int i = 0;
  if (value < 0) buf[i++] = '-';
  while (n > 0) buf[i++] = digits[--n];
  buf[i] = '\0';
  return buf;
}

void Report(int sig) {
  char number[24];
  WriteString("*** ");
  WriteString(g_program);
  WriteString(": fatal signal ");
  WriteString(FormatNumber(sig, number));
  WriteString(" (");
  WriteString(SignalName(sig));
  WriteString(") in thread ");
  WriteString(FormatNumber(static_cast<long>(syscall(SYS_gettid)), number));
  WriteString(" of pid ");
  WriteString(FormatNumber(static_cast<long>(getpid()), number));
  WriteString("; stack:\n");
  void* frames[kMaxFrames];
  const int depth = backtrace(frames, kMaxFrames);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  WriteString("*** end of stack\n");
}

void OnFatalSignal(int sig, siginfo_t*, void*) {
  if (!g_reporting.exchange(true)) Report(sig);
  // Die of the same signal: the default action, re-raised (a fault re-executes the faulting
  // instruction once the handler returns, which raises it again with the default action).
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void InstallCrashReport(const char* program) {
  g_program = program;
  // The first backtrace() may allocate (it loads libgcc's unwinder): do it here, not in the
  // handler.
  void* warm[1];
  backtrace(warm, 1);
  static char alternate_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alternate_stack;
  ss.ss_size = sizeof(alternate_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction action {};
  action.sa_sigaction = OnFatalSignal;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (int sig : kFatalSignals) sigaction(sig, &action, nullptr);
}

}  // namespace stagecoach
