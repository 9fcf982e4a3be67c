// Build info, histogram buckets and the /metrics HTTP endpoint (see metrics.h).
#include "common/metrics/metrics.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/address.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

#ifndef STAGECOACH_VERSION
#error "STAGECOACH_VERSION must be defined by the build (common/CMakeLists.txt)"
#endif

namespace stagecoach::metrics {
namespace {

// How often the serving thread checks whether it should stop.
constexpr int kPollMillis = 100;
// Bound on reading a request and writing an answer on one connection.
constexpr int kConnectionTimeoutSeconds = 5;
// Largest request head read; anything longer is answered 431.
constexpr size_t kMaxRequestBytes = 8192;

// Writes all of `data`; false when the peer went away or the send timed out.
bool SendAll(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string Answer(absl::string_view status, absl::string_view content_type,
                   const std::string& body) {
  return absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

const char* BuildVersion() { return STAGECOACH_VERSION; }

void AddBuildInfo(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("stagecoach_build_info")
      .Help("Always 1; the version label is the Stagecoach version this binary was built from")
      .Register(registry)
      .Add({{"version", BuildVersion()}})
      .Set(1);
}

std::vector<double> DurationBucketsSeconds() {
  std::vector<double> buckets;
  for (double decade = 1e-4; decade < 100; decade *= 10) {
    buckets.push_back(decade);
    buckets.push_back(2.5 * decade);
    buckets.push_back(5 * decade);
  }
  buckets.push_back(100);
  return buckets;
}

std::string SerializeText(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Registry> registry,
    const std::string& flag, std::function<void()> before_scrape) {
  auto host_port = rpc::ParseHostPort(listen, flag);
  if (!host_port.ok()) return host_port.status();
  const std::string what = absl::StrCat(flag, ": cannot serve metrics on ", listen, ": ");
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const bool wildcard = rpc::IsWildcardHost(host_port->host) && host_port->host != "::";
  if (int rc = getaddrinfo(wildcard ? nullptr : host_port->host.c_str(),
                           absl::StrCat(host_port->port).c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, gai_strerror(rc)));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  int rc = fd < 0 ? -1 : setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (rc == 0) rc = bind(fd, found->ai_addr, found->ai_addrlen);
  if (rc == 0) rc = ::listen(fd, 16);
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (rc == 0) rc = getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  if (rc != 0) {
    const int err = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat(what, std::strerror(err)));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->listen_fd_ = fd;
  server->port_ =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  host_port->port = server->port_;
  server->address_ = host_port->ToString();
  server->registry_ = std::move(registry);
  server->before_scrape_ = std::move(before_scrape);
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void MetricsServer::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, kPollMillis) <= 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    timeval tv{kConnectionTimeoutSeconds, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    std::string request;
    char buf[1024];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
      ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string answer;
    if (request.find("\r\n\r\n") == std::string::npos) {
      answer = Answer("400 Bad Request", "text/plain", "incomplete or oversized request\n");
    } else if (absl::StartsWith(request, "GET /metrics ") ||
               absl::StartsWith(request, "GET /metrics?")) {
      if (before_scrape_) before_scrape_();
      answer =
          Answer("200 OK", "text/plain; version=0.0.4; charset=utf-8", SerializeText(*registry_));
    } else {
      answer = Answer("404 Not Found", "text/plain", "metrics are at /metrics\n");
    }
    if (!SendAll(conn, answer)) spdlog::debug("metrics: a scraper went away mid-answer");
    close(conn);
  }
}

}  // namespace stagecoach::metrics
