// TLS and mutual TLS for the gRPC hops (stagectl -> coordinator, coordinator -> worker,
// worker -> coordinator): server and channel credentials built from PEM files named by the
// daemons' and stagectl's --tls-* flags.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagecoach::rpc {

// PEM files of one process, as its flags name them. Every path may be empty.
struct TlsFiles {
  std::string cert;  // --tls-cert: this process's certificate chain (served, and presented as
                     // client certificate when it calls others)
  std::string key;   // --tls-key: the private key of `cert`
  std::string ca;    // --tls-ca: the CA that signs the peers' certificates
  // --tls-require-client-cert: a server verifies client certificates against `ca` and refuses
  // clients without one (mutual TLS).
  bool require_client_cert = false;

  // True when any file is named: then every hop of this process uses TLS.
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The contents of the PEM file `path` named by `flag`; INVALID_ARGUMENT naming the flag and
// the file when it is missing, unreadable, empty or holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag);

// Server credentials for `files`: null (plaintext) when no file is named; TLS with `cert` and
// `key`; with `require_client_cert`, mutual TLS (clients must present a certificate signed by
// `ca`). INVALID_ARGUMENT naming the flag for an inconsistent set (a key without a certificate,
// --tls-require-client-cert without --tls-ca, a CA without a certificate to serve) or a file
// that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// Channel credentials for `files`: insecure when no file is named; otherwise TLS verifying the
// server against `ca` (the system's roots when no CA is named), presenting `cert`/`key` as
// client certificate when both are named. INVALID_ARGUMENT naming the flag as above.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

}  // namespace stagecoach::rpc
