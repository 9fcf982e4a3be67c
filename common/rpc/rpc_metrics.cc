// RPC latency metrics of a gRPC server (see rpc_metrics.h).
#include "common/rpc/rpc_metrics.h"

#include <grpcpp/support/interceptor.h>
#include <grpcpp/support/status.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace stagecoach::rpc {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Times one call: starts when its initial metadata arrives, observes when its status is sent
// (or, for a call that ends without sending one, when it is destroyed, as CANCELLED).
class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(prometheus::Family<prometheus::Histogram>& family, std::string method)
      : family_(family), method_(std::move(method)) {}

  ~RpcMetricsInterceptor() override {
    if (started_ && !observed_) Observe(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      start_ = absl::Now();
      started_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !observed_) {
      if (!started_) {  // a call that failed before its metadata was read
        start_ = absl::Now();
        started_ = true;
      }
      Observe(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Observe(grpc::StatusCode code) {
    observed_ = true;
    family_
        .Add({{"method", method_}, {"code", RpcCodeLabel(code)}}, metrics::DurationBucketsSeconds())
        .Observe(absl::ToDoubleSeconds(absl::Now() - start_));
  }

  prometheus::Family<prometheus::Histogram>& family_;
  const std::string method_;
  absl::Time start_;
  bool started_ = false;
  bool observed_ = false;
};

class RpcMetricsFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(prometheus::Registry& registry)
      : family_(prometheus::BuildHistogram()
                    .Name(kRpcServerDurationMetric)
                    .Help("Duration of gRPC calls served, from their initial metadata to their "
                          "status, by method and status code")
                    .Register(registry)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const char* method = info->method();
    return new RpcMetricsInterceptor(family_,
                                     RpcMethodLabel(method != nullptr ? method : "unknown"));
  }

 private:
  prometheus::Family<prometheus::Histogram>& family_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsFactory(
    prometheus::Registry& registry) {
  return std::make_unique<RpcMetricsFactory>(registry);
}

std::string RpcMethodLabel(absl::string_view path) {
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  const size_t slash = path.find('/');
  if (slash == absl::string_view::npos) return std::string(path);
  absl::string_view service = path.substr(0, slash);
  const size_t dot = service.rfind('.');
  if (dot != absl::string_view::npos) service.remove_prefix(dot + 1);
  return absl::StrCat(service, path.substr(slash));
}

std::string RpcCodeLabel(int code) {
  switch (static_cast<grpc::StatusCode>(code)) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::UNKNOWN:
      return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED:
      return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return absl::StrCat(code);
  }
}

}  // namespace stagecoach::rpc
