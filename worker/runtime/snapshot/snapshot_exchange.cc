#include "worker/runtime/snapshot/snapshot_exchange.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// One peer's side of the exchange: what is sent, and the buffers received into.
struct Peer {
  uint64_t send_length = 0;
  std::string send_header;
  uint64_t recv_length = 0;
  std::string recv_header;
  v1::SnapshotCopy received;
  std::vector<std::shared_ptr<std::vector<char>>> recv_files;
};

// Waits for every posted transfer; the first error, naming `what` and the peer.
absl::Status WaitAll(std::vector<std::pair<int, std::unique_ptr<transport::Work>>>& works,
                     absl::Duration timeout, const char* what) {
  for (auto& [peer, work] : works) {
    absl::Status done = work->Wait(timeout);
    if (!done.ok()) {
      return absl::Status(done.code(), absl::StrCat("snapshot exchange with rank ", peer, " (",
                                                    what, "): ", done.message()));
    }
  }
  works.clear();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> ExchangeSnapshotFiles(
    transport::Transport& transport, const std::map<int, std::vector<SnapshotFile>>& outgoing,
    const std::vector<int>& incoming, absl::Duration timeout) {
  std::map<int, Peer> peers;
  for (const auto& [q, files] : outgoing) {
    v1::SnapshotCopy header;
    for (const SnapshotFile& f : files) {
      header.set_rank(f.rank);
      *header.add_files() = f.entry;
    }
    Peer& peer = peers[q];
    peer.send_header = header.SerializeAsString();
    peer.send_length = peer.send_header.size();
  }
  for (int q : incoming) peers[q];
  std::vector<std::pair<int, std::unique_ptr<transport::Work>>> works;
  auto post = [&](int q, absl::StatusOr<std::unique_ptr<transport::Work>> work) -> absl::Status {
    if (!work.ok()) {
      return absl::Status(work.status().code(), absl::StrCat("snapshot exchange with rank ", q,
                                                             ": ", work.status().message()));
    }
    works.emplace_back(q, *std::move(work));
    return absl::OkStatus();
  };
  // 1. Header lengths, 2. headers, 3. the files' bytes.
  for (int q : incoming) {
    RETURN_IF_ERROR(post(q, transport.Recv(&peers[q].recv_length, 8, q, kSnapshotTag)));
  }
  for (const auto& [q, files] : outgoing) {
    RETURN_IF_ERROR(post(q, transport.Send(&peers[q].send_length, 8, q, kSnapshotTag)));
  }
  RETURN_IF_ERROR(WaitAll(works, timeout, "header length"));
  for (int q : incoming) {
    Peer& peer = peers[q];
    if (peer.recv_length > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat("snapshot exchange with rank ", q,
                                                     ": a header of ", peer.recv_length, " bytes"));
    }
    peer.recv_header.resize(peer.recv_length);
    RETURN_IF_ERROR(
        post(q, transport.Recv(peer.recv_header.data(), peer.recv_length, q, kSnapshotTag)));
  }
  for (const auto& [q, files] : outgoing) {
    Peer& peer = peers[q];
    RETURN_IF_ERROR(
        post(q, transport.Send(peer.send_header.data(), peer.send_length, q, kSnapshotTag)));
  }
  RETURN_IF_ERROR(WaitAll(works, timeout, "header"));
  for (int q : incoming) {
    Peer& peer = peers[q];
    if (!peer.received.ParseFromString(peer.recv_header)) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot exchange with rank ", q, ": its header does not parse"));
    }
    for (const v1::StageCheckpointFile& f : peer.received.files()) {
      if (f.size_bytes() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("snapshot exchange with rank ", q, ": ",
                                                       f.file(), " has a negative size"));
      }
      auto& buffer = peer.recv_files.emplace_back(
          std::make_shared<std::vector<char>>(static_cast<size_t>(f.size_bytes())));
      if (buffer->empty()) continue;
      RETURN_IF_ERROR(post(q, transport.Recv(buffer->data(), buffer->size(), q, kSnapshotTag)));
    }
  }
  for (const auto& [q, files] : outgoing) {
    for (const SnapshotFile& f : files) {
      if (f.bytes->empty()) continue;
      RETURN_IF_ERROR(post(q, transport.Send(f.bytes->data(), f.bytes->size(), q, kSnapshotTag)));
    }
  }
  RETURN_IF_ERROR(WaitAll(works, timeout, "files"));
  std::map<int, std::vector<SnapshotFile>> received;
  for (int q : incoming) {
    Peer& peer = peers[q];
    std::vector<SnapshotFile>& files = received[q];
    for (int i = 0; i < peer.received.files_size(); ++i) {
      const v1::StageCheckpointFile& entry = peer.received.files(i);
      const std::vector<char>& bytes = *peer.recv_files[i];
      const std::string sha = Sha256Hex(absl::string_view(bytes.data(), bytes.size()));
      if (sha != entry.sha256()) {
        return absl::DataLossError(absl::StrCat("snapshot file ", entry.file(), " from rank ", q,
                                                ": expected sha256 ", entry.sha256(), ", found ",
                                                sha));
      }
      files.push_back(SnapshotFile{peer.received.rank(), entry, std::move(peer.recv_files[i])});
    }
  }
  return received;
}

}  // namespace stagecoach::runtime
