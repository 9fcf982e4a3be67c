#include "worker/runtime/snapshot/snapshot_exchange.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace stagecoach::runtime {
namespace {

// Largest header accepted (a header lists a rank's files: a few hundred bytes each).
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 30;

// One exchange: each peer's buffers and the transfers posted into them. The buffers live as
// long as the exchange, and a failed exchange aborts the transport before they go, so no
// transfer still posted can touch freed memory.
class Exchange {
 public:
  Exchange(transport::Transport& transport, absl::Duration timeout)
      : transport_(transport), timeout_(timeout) {}

  absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> Run(
      const std::map<int, std::vector<SnapshotFile>>& outgoing, const std::vector<int>& incoming) {
    absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> out = Phases(outgoing, incoming);
    if (!out.ok()) {
      transport_.Abort();
      for (auto& [peer, work] : works_) work->Wait(absl::Seconds(1)).IgnoreError();
    }
    return out;
  }

 private:
  struct Peer {
    uint64_t send_length = 0;
    std::string send_header;
    uint64_t recv_length = 0;
    std::string recv_header;
    v1::SnapshotCopy received;
    std::vector<std::shared_ptr<std::vector<char>>> recv_files;
  };

  // 1. Header lengths, 2. headers, 3. the files' bytes; each phase posted whole, then waited.
  absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> Phases(
      const std::map<int, std::vector<SnapshotFile>>& outgoing, const std::vector<int>& incoming) {
    for (const auto& [q, files] : outgoing) {
      v1::SnapshotCopy header;
      for (const SnapshotFile& f : files) {
        header.set_rank(f.rank);
        *header.add_files() = f.entry;
      }
      peers_[q].send_header = header.SerializeAsString();
      peers_[q].send_length = peers_[q].send_header.size();
    }
    for (int q : incoming) RETURN_IF_ERROR(Recv(q, &peers_[q].recv_length, 8));
    for (const auto& [q, files] : outgoing) RETURN_IF_ERROR(Send(q, &peers_[q].send_length, 8));
    RETURN_IF_ERROR(WaitAll("header length"));
    for (int q : incoming) {
      Peer& peer = peers_[q];
      if (peer.recv_length > kMaxHeaderBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "snapshot exchange with rank ", q, ": a header of ", peer.recv_length, " bytes"));
      }
      peer.recv_header.resize(peer.recv_length);
      RETURN_IF_ERROR(Recv(q, peer.recv_header.data(), peer.recv_length));
    }
    for (const auto& [q, files] : outgoing) {
      RETURN_IF_ERROR(Send(q, peers_[q].send_header.data(), peers_[q].send_length));
    }
    RETURN_IF_ERROR(WaitAll("header"));
    for (int q : incoming) RETURN_IF_ERROR(PostFileReceives(q));
    for (const auto& [q, files] : outgoing) {
      for (const SnapshotFile& f : files) {
        if (!f.bytes->empty()) RETURN_IF_ERROR(Send(q, f.bytes->data(), f.bytes->size()));
      }
    }
    RETURN_IF_ERROR(WaitAll("files"));
    std::map<int, std::vector<SnapshotFile>> received;
    for (int q : incoming) {
      ASSIGN_OR_RETURN(received[q], Checked(q));
    }
    return received;
  }

  // Parses peer q's header and posts a receive for each file it lists.
  absl::Status PostFileReceives(int q) {
    Peer& peer = peers_[q];
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
      if (!buffer->empty()) RETURN_IF_ERROR(Recv(q, buffer->data(), buffer->size()));
    }
    return absl::OkStatus();
  }

  // Peer q's files, each checked against its entry's SHA-256.
  absl::StatusOr<std::vector<SnapshotFile>> Checked(int q) {
    Peer& peer = peers_[q];
    std::vector<SnapshotFile> files;
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
    return files;
  }

  absl::Status Send(int q, const void* data, size_t bytes) {
    return Posted(q, transport_.Send(data, bytes, q, kSnapshotTag));
  }
  absl::Status Recv(int q, void* data, size_t bytes) {
    return Posted(q, transport_.Recv(data, bytes, q, kSnapshotTag));
  }
  absl::Status Posted(int q, absl::StatusOr<std::unique_ptr<transport::Work>> work) {
    if (!work.ok()) {
      return absl::Status(work.status().code(), absl::StrCat("snapshot exchange with rank ", q,
                                                             ": ", work.status().message()));
    }
    works_.emplace_back(q, *std::move(work));
    return absl::OkStatus();
  }

  // Waits for every posted transfer; the first error, naming `what` and the peer.
  absl::Status WaitAll(const char* what) {
    for (auto& [peer, work] : works_) {
      absl::Status done = work->Wait(timeout_);
      if (!done.ok()) {
        return absl::Status(done.code(), absl::StrCat("snapshot exchange with rank ", peer, " (",
                                                      what, "): ", done.message()));
      }
    }
    works_.clear();
    return absl::OkStatus();
  }

  transport::Transport& transport_;
  const absl::Duration timeout_;
  std::map<int, Peer> peers_;
  std::vector<std::pair<int, std::unique_ptr<transport::Work>>> works_;
};

}  // namespace

absl::StatusOr<std::map<int, std::vector<SnapshotFile>>> ExchangeSnapshotFiles(
    transport::Transport& transport, const std::map<int, std::vector<SnapshotFile>>& outgoing,
    const std::vector<int>& incoming, absl::Duration timeout) {
  Exchange exchange(transport, timeout);
  return exchange.Run(outgoing, incoming);
}

}  // namespace stagecoach::runtime
