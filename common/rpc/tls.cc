#include "common/rpc/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stagecoach::rpc {
namespace {

// Checks that a certificate and its key come together.
absl::Status CheckPair(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        files.cert.empty() ? "--tls-key: given without --tls-cert (the certificate it belongs to)"
                           : "--tls-cert: given without --tls-key (its private key)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "' (missing or not readable)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": error reading '", path, "'"));
  }
  std::string pem = text.str();
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", path, "' is ", pem.empty() ? "empty" : "not PEM (no -----BEGIN line)"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) {
    if (files.require_client_cert) {
      return absl::InvalidArgumentError(
          "--tls-require-client-cert: needs --tls-cert, --tls-key and --tls-ca");
    }
    return std::shared_ptr<grpc::ServerCredentials>();
  }
  if (absl::Status s = CheckPair(files); !s.ok()) return s;
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls-ca: given without --tls-cert and --tls-key (the certificate this server serves)");
  }
  if (files.require_client_cert && files.ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-require-client-cert: needs --tls-ca (the CA that signs client certificates)");
  }
  grpc::SslServerCredentialsOptions options(
      files.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadPemFile(files.cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(files.key, "--tls-key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.ca.empty()) {
    auto ca = ReadPemFile(files.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  if (absl::Status s = CheckPair(files); !s.ok()) return s;
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    auto ca = ReadPemFile(files.ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!files.cert.empty()) {
    auto cert = ReadPemFile(files.cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPemFile(files.key, "--tls-key");
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

}  // namespace stagecoach::rpc
