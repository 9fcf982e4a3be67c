// A minimal HTTP GET and a Prometheus text parser for tests (see prometheus_scrape.h).
#include "tests/support/prometheus_scrape.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc/address.h"

namespace stagecoach::testing {
namespace {

// Closes a socket when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// Waits until `fd` is ready for `events` or `deadline`; false on timeout.
bool WaitFor(int fd, short events, absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  if (ms <= 0) return false;
  pollfd p{fd, events, 0};
  return poll(&p, 1, static_cast<int>(ms)) > 0;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout) {
  const std::string url = absl::StrCat("http://", host_port, path);
  const absl::Time deadline = absl::Now() + timeout;
  auto hp = rpc::ParseHostPort(host_port, "metrics address");
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(hp->host.c_str(), absl::StrCat(hp->port).c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat(url, ": ", gai_strerror(rc)));
  }
  Fd sock;
  sock.fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int rc = sock.fd < 0 ? -1 : connect(sock.fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (rc != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat(url, ": connect: ", std::strerror(errno)));
  }
  if (!WaitFor(sock.fd, POLLOUT, deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(url, ": no connection within the timeout"));
  }
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return absl::UnavailableError(absl::StrCat(url, ": ", std::strerror(err)));

  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    if (!WaitFor(sock.fd, POLLOUT, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(url, ": sending timed out"));
    }
    ssize_t n = send(sock.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(url, ": send: ", std::strerror(errno)));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[8192];
  while (true) {
    if (!WaitFor(sock.fd, POLLIN, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(url, ": no complete answer in time"));
    }
    ssize_t n = recv(sock.fd, buf, sizeof(buf), 0);
    if (n == 0) break;  // HTTP/1.0: the server closes after the body
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat(url, ": recv: ", std::strerror(errno)));
    }
    answer.append(buf, static_cast<size_t>(n));
  }
  const size_t header_end = answer.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError(absl::StrCat(url, ": answer without headers: '", answer, "'"));
  }
  const std::string status_line = answer.substr(0, answer.find("\r\n"));
  if (!absl::StrContains(status_line, " 200")) {
    return absl::InternalError(absl::StrCat(url, ": ", status_line));
  }
  return answer.substr(header_end + 4);
}

absl::StatusOr<std::map<std::string, double>> ParsePrometheusText(const std::string& text) {
  std::map<std::string, double> samples;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("metrics line without a value: '", line, "'"));
    }
    absl::string_view number = line.substr(space + 1);
    if (number == "+Inf") {
      value = HUGE_VAL;
    } else if (number == "-Inf") {
      value = -HUGE_VAL;
    } else if (!absl::SimpleAtod(number, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line with a bad value: '", line, "'"));
    }
    samples[std::string(line.substr(0, space))] = value;
  }
  return samples;
}

absl::StatusOr<std::map<std::string, double>> Scrape(const std::string& host_port,
                                                     absl::Duration timeout) {
  auto body = HttpGet(host_port, "/metrics", timeout);
  if (!body.ok()) return body.status();
  return ParsePrometheusText(*body);
}

}  // namespace stagecoach::testing
