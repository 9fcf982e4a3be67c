// Rows of whole documents (worker/runtime/data/document_rows.h): documents cut after each
// EOS, pad rows of one document cut to seq, packed rows of whole documents with their segments,
// and a microbatch cut to its longest row; and a tokens file with data.packing read through
// BatchSource (the EOS from data.eos, a file without a document refused naming data.path).
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "worker/runtime/executor/training_setup.h"
#include "worker/runtime/data/document_rows.h"
#include "worker/runtime/data/training_data.h"

namespace stagecoach::runtime::document_rows_test {
namespace {

constexpr int64_t kEos = 9;

std::vector<int64_t> Row(const torch::Tensor& t, int64_t r) {
  const torch::Tensor row = t[r].contiguous();
  return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
}

TEST(DocumentRows, DocumentsEndAfterEachEosAndTooShortOnesAreLeftOut) {
  //                               doc 0       | EOS alone | doc 1     | tail without EOS
  const std::vector<int64_t> tokens = {1, 2, 3, kEos, kEos, 4, kEos, 5, 6};
  const std::vector<DocumentSpan> docs = SplitDocuments(tokens, kEos);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].begin, 0);
  EXPECT_EQ(docs[0].end, 4);
  EXPECT_EQ(docs[1].begin, 5);
  EXPECT_EQ(docs[1].end, 7);
  EXPECT_EQ(docs[2].begin, 7);
  EXPECT_EQ(docs[2].end, 9);
  EXPECT_TRUE(SplitDocuments({kEos, kEos, 3}, kEos).empty());
}

TEST(DocumentRows, PadRowsAreOneDocumentEachCutToSeq) {
  // Documents of 4, 2 and 7 tokens (3, 1 and 6 positions).
  const std::vector<int64_t> tokens = {1, 2, 3, kEos, 4, kEos, 5, 6, 7, 8, 1, 2, kEos};
  const auto docs = SplitDocuments(tokens, kEos);
  ASSERT_EQ(docs.size(), 3u);
  const Batch b = DocumentRows(tokens, docs, kEos, /*pack=*/false, 16, 4, 7, 0);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{16, 4}));
  EXPECT_FALSE(b.segments.defined());
  std::set<int64_t> lengths;
  for (int64_t r = 0; r < 16; ++r) {
    const int64_t len = b.row_lengths[r].item<int64_t>();
    lengths.insert(len);
    const std::vector<int64_t> in = Row(b.inputs, r), tg = Row(b.targets, r);
    if (len == 3) {
      EXPECT_EQ(in, (std::vector<int64_t>{1, 2, 3, kEos}));
      EXPECT_EQ(tg, (std::vector<int64_t>{2, 3, kEos, kIgnoredTarget}));
    } else if (len == 1) {
      EXPECT_EQ(in, (std::vector<int64_t>{4, kEos, kEos, kEos}));
      EXPECT_EQ(tg, (std::vector<int64_t>{kEos, kIgnoredTarget, kIgnoredTarget, kIgnoredTarget}));
    } else {
      ASSERT_EQ(len, 4) << "the 6-position document cut to seq";
      EXPECT_EQ(in, (std::vector<int64_t>{5, 6, 7, 8}));
      EXPECT_EQ(tg, (std::vector<int64_t>{6, 7, 8, 1}));
    }
  }
  EXPECT_EQ(lengths.size(), 3u) << "16 draws from 3 documents";
  // The same step draws the same rows; another step others.
  const Batch again = DocumentRows(tokens, docs, kEos, false, 16, 4, 7, 0);
  EXPECT_TRUE(torch::equal(again.inputs, b.inputs));
  EXPECT_FALSE(torch::equal(DocumentRows(tokens, docs, kEos, false, 16, 4, 7, 1).row_lengths,
                            b.row_lengths));
}

TEST(DocumentRows, PackedRowsHoldWholeDocumentsWithTheirSegments) {
  // Documents of 3, 2, 3 and 9 positions.
  const std::vector<int64_t> tokens = {1, 2, 3, kEos, 4, 5, kEos, 6, 7, 8, kEos,
                                       1, 2, 3, 4, 5, 6, 7, 8, 1, kEos};
  const auto docs = SplitDocuments(tokens, kEos);
  ASSERT_EQ(docs.size(), 4u);
  const int64_t seq = 8;
  const Batch b = DocumentRows(tokens, docs, kEos, /*pack=*/true, 32, seq, 3, 2);
  ASSERT_TRUE(b.segments.defined());
  const std::vector<int64_t> positions = {3, 2, 3, 9};
  for (int64_t r = 0; r < 32; ++r) {
    const std::vector<int64_t> seg = Row(b.segments, r), tg = Row(b.targets, r);
    const int64_t len = b.row_lengths[r].item<int64_t>();
    ASSERT_GE(len, 1);
    // Segments number the documents from 0 and stop at the row's length.
    for (int64_t i = 0; i < seq; ++i) {
      if (i >= len) {
        EXPECT_EQ(seg[i], -1);
        EXPECT_EQ(tg[i], kIgnoredTarget);
      } else {
        EXPECT_GE(seg[i], 0);
        EXPECT_TRUE(i == 0 ? seg[i] == 0 : seg[i] - seg[i - 1] <= 1);
      }
    }
    // Every document but a cut first one is whole: its positions in the row are all of its own,
    // and the next document would not have fitted.
    const int64_t documents = seg[len - 1] + 1;
    if (documents == 1 && len == seq) continue;  // one document cut to seq, or one that fits
    int64_t first = -1;
    for (int64_t d = 0; d < static_cast<int64_t>(docs.size()); ++d) {
      const std::vector<int64_t> in = Row(b.inputs, r);
      if (std::equal(in.begin(), in.begin() + positions[d],
                     tokens.begin() + docs[d].begin)) {
        first = d;
        break;
      }
    }
    ASSERT_GE(first, 0) << "row " << r << " starts with a whole document";
    int64_t expected = 0, d = first;
    for (int64_t k = 0; k < documents; ++k, d = (d + 1) % 4) expected += positions[d];
    EXPECT_EQ(len, expected) << "row " << r;
    EXPECT_GT(len + positions[d], seq) << "row " << r << ": the next document would have fitted";
  }
}

TEST(DocumentRows, AMicrobatchIsCutToItsLongestRow) {
  const torch::Tensor x = torch::arange(12, torch::kInt64).reshape({2, 6});
  const torch::Tensor cut = TrimToLongestRow(x, torch::tensor({2, 4}, torch::kInt64));
  EXPECT_EQ(cut.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(torch::equal(cut, x.slice(1, 0, 4)));
}

TEST(DocumentRows, ATokensFileWithPackingIsReadAsDocuments) {
  stagecoach::testing::TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  auto write = [&](const std::vector<uint16_t>& ids) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);
  };
  spec::JobSpec spec;
  spec.model.builtin = spec::BuiltinModel{};
  spec.model.builtin->family = "gpt";
  spec.model.builtin->vocab = 16;
  spec.model.builtin->seq = 4;
  spec.training.batch_size = 4;
  spec.data.kind = "tokens";
  spec.data.path = path;
  spec.data.packing = "pad";
  spec.data.eos = kEos;
  write({1, 2, kEos, 3, 4, 5, kEos});
  auto source = BatchSource::Open(spec, true, true);
  ASSERT_TRUE(source.ok()) << source.status();
  auto batch = (*source)->Make(0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->inputs.sizes(), (std::vector<int64_t>{4, 4}));
  EXPECT_TRUE(batch->row_lengths.defined());

  write({kEos, kEos});
  source = BatchSource::Open(spec, true, true);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(source.status().message().find("data.path: '" + path + "' holds no document"),
            std::string::npos)
      << source.status();

  spec.data.eos.reset();
  source = BatchSource::Open(spec, true, true);
  EXPECT_NE(source.status().message().find("data.packing: pad needs the id that ends each document"),
            std::string::npos)
      << source.status();
  // A TorchScript model cannot keep a packed row's documents apart.
  spec::JobSpec scripted = spec;
  scripted.model.builtin.reset();
  scripted.data.seq = 4;
  scripted.data.eos = kEos;
  scripted.data.packing = "pack";
  source = BatchSource::Open(scripted, true, true);
  EXPECT_NE(source.status().message().find("data.packing: pack needs a built-in gpt or llama"),
            std::string::npos)
      << source.status();
  spec.data.eos = 16;
  source = BatchSource::Open(spec, true, true);
  EXPECT_NE(source.status().message().find("data.eos: 16 is not below model.builtin.vocab = 16"),
            std::string::npos)
      << source.status();
}

}  // namespace
}  // namespace stagecoach::runtime::document_rows_test
