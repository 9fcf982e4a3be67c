// Who may call which CoordinatorService method: the bearer tokens the coordinator requires
// ("authorization: Bearer <token>" metadata), applied to every call in one place by serving the
// service behind rpc::AuthorizeEveryCall with CoordinatorCallCheck.
//
//   client methods (stagectl: SubmitJob ... UploadArtifact, and any method not listed below)
//                                      need the client token (--client-token-file);
//   worker methods (RegisterWorker, Heartbeat, ReportStep, ReportTaskEnd, SettleStep,
//                   ReportSnapshot, SetKey, GetKey, WaitKeys)
//                                      need the worker token (--worker-token-file);
//   FetchArtifact                      takes either.
// An empty token is not required. Wrong or missing: UNAUTHENTICATED naming the token expected
// (the tokens themselves are never echoed).
#pragma once

#include <string>

#include "common/rpc/authorized_service.h"

namespace stagecoach::coordinator {

struct CoordinatorAuth {
  std::string client_token;
  std::string worker_token;
};

// The check of every CoordinatorService call under `auth`. Thread-safe.
rpc::CallCheck CoordinatorCallCheck(CoordinatorAuth auth);

}  // namespace stagecoach::coordinator
