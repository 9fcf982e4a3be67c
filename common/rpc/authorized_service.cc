#include "common/rpc/authorized_service.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/method_handler.h>

#include <deque>

#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"

namespace stagecoach::rpc {
namespace {

using grpc::internal::MethodHandler;
using grpc::internal::RpcMethod;

// grpc::Service keeps its handlers to itself (GetHandler is protected); a member pointer taken
// through a subclass reads them from any Service.
struct HandlerAccess : grpc::Service {
  static MethodHandler* Get(grpc::Service* service, int index) {
    return (service->*&HandlerAccess::GetHandler)(index);
  }
};

// Answers a call from the client's stream (whose handler ignores a failed request status) with
// `status` without running the handler.
template <grpc::StatusCode kCode>
void RefuseWith(const MethodHandler::HandlerParameter& param, const std::string& message) {
  grpc::internal::ErrorMethodHandler<kCode>(message).RunHandler(param);
}

void RefuseStream(const MethodHandler::HandlerParameter& param, const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return RefuseWith<grpc::StatusCode::UNAUTHENTICATED>(param, status.error_message());
    case grpc::StatusCode::PERMISSION_DENIED:
      return RefuseWith<grpc::StatusCode::PERMISSION_DENIED>(param, status.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION:
      return RefuseWith<grpc::StatusCode::FAILED_PRECONDITION>(param, status.error_message());
    case grpc::StatusCode::UNAVAILABLE:
      return RefuseWith<grpc::StatusCode::UNAVAILABLE>(param, status.error_message());
    default:
      return RefuseWith<grpc::StatusCode::INTERNAL>(param, status.error_message());
  }
}

// Runs the check, then the service's handler.
class CheckedHandler : public MethodHandler {
 public:
  CheckedHandler(MethodHandler* inner, std::string method, RpcMethod::RpcType type,
                 const CallCheck* check)
      : inner_(inner), method_(std::move(method)), type_(type), check_(check) {}

  void RunHandler(const HandlerParameter& param) override {
    const auto& ctx = *static_cast<grpc::ServerContext*>(param.server_context);
    const absl::Status verdict = param.status.ok() ? (*check_)(ctx, method_) : absl::OkStatus();
    if (verdict.ok()) {
      inner_->RunHandler(param);
      return;
    }
    const grpc::Status refused = ToGrpcStatus(verdict);
    if (type_ == RpcMethod::NORMAL_RPC || type_ == RpcMethod::SERVER_STREAMING) {
      // These handlers answer a failed request status without calling the service (and free
      // the request they deserialised).
      inner_->RunHandler(HandlerParameter(param.call, param.server_context, param.request, refused,
                                          param.internal_data, param.call_requester));
      return;
    }
    RefuseStream(param, refused);
  }

  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status,
                    void** handler_data) override {
    return inner_->Deserialize(call, req, status, handler_data);
  }

 private:
  MethodHandler* const inner_;
  const std::string method_;
  const RpcMethod::RpcType type_;
  const CallCheck* const check_;
};

class AuthorizedService : public grpc::Service {
 public:
  explicit AuthorizedService(CallCheck check) : check_(std::move(check)) {}

  void Add(MethodHandler* inner, const google::protobuf::MethodDescriptor& method,
           const std::string& service_full_name) {
    const RpcMethod::RpcType type =
        method.client_streaming()
            ? (method.server_streaming() ? RpcMethod::BIDI_STREAMING : RpcMethod::CLIENT_STREAMING)
            : (method.server_streaming() ? RpcMethod::SERVER_STREAMING : RpcMethod::NORMAL_RPC);
    // RpcMethod keeps the name's pointer: the string lives as long as the service.
    const std::string& name =
        names_.emplace_back(absl::StrCat("/", service_full_name, "/", method.name()));
    AddMethod(new grpc::internal::RpcServiceMethod(
        name.c_str(), type, new CheckedHandler(inner, method.name(), type, &check_)));
  }

 private:
  const CallCheck check_;
  std::deque<std::string> names_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Service>> AuthorizeEveryCall(
    grpc::Service* service, const std::string& service_full_name, CallCheck check) {
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_full_name);
  if (descriptor == nullptr) {
    return absl::NotFoundError(absl::StrCat("no proto service '", service_full_name, "'"));
  }
  auto out = std::make_unique<AuthorizedService>(std::move(check));
  for (int i = 0; i < descriptor->method_count(); ++i) {
    MethodHandler* handler = HandlerAccess::Get(service, i);
    if (handler == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          service_full_name, ".", descriptor->method(i)->name(), " is not served synchronously"));
    }
    out->Add(handler, *descriptor->method(i), service_full_name);
  }
  return std::unique_ptr<grpc::Service>(std::move(out));
}

}  // namespace stagecoach::rpc
