#include "client/npy_object_rows.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace stagecoach::client {
namespace {

// A value the pickle builds.
struct PickleValue {
  enum Kind { kNone, kBool, kInt, kStr, kBytes, kTuple, kList, kGlobal, kArray, kDtype, kMark };
  Kind kind = kNone;
  int64_t number = 0;                               // kBool, kInt
  std::string text;                                 // kStr, kBytes, kGlobal ("module name"),
                                                    // kDtype (its name, "i8")
  std::vector<std::shared_ptr<PickleValue>> items;  // kTuple, kList; kArray: [state] once built
  char byteorder = '=';                             // kDtype
};
using Value = std::shared_ptr<PickleValue>;

Value Make(PickleValue::Kind kind) {
  auto v = std::make_shared<PickleValue>();
  v->kind = kind;
  return v;
}

bool IsReconstruct(const std::string& global) {
  return global == "numpy.core.multiarray _reconstruct" ||
         global == "numpy._core.multiarray _reconstruct";
}

// The restricted unpickler's state.
class ObjectUnpickler {
 public:
  ObjectUnpickler(absl::string_view bytes, absl::string_view name) : in_(bytes), name_(name) {}

  absl::StatusOr<Value> Run() {
    while (pos_ < in_.size()) {
      const unsigned char op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') {  // STOP
        if (stack_.size() != 1) return Bad("the pickle ends with more than one value");
        return stack_.back();
      }
      RETURN_IF_ERROR(Step(op));
    }
    return Bad("the pickle ends without a STOP");
  }

 private:
  absl::Status Bad(absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": object array: ", why));
  }
  absl::StatusOr<uint64_t> Unsigned(size_t n) {
    if (in_.size() - pos_ < n) return Bad("truncated pickle");
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= uint64_t{static_cast<unsigned char>(in_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }
  absl::StatusOr<std::string> Raw(uint64_t n) {
    if (in_.size() - pos_ < n) return Bad("truncated pickle");
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  absl::StatusOr<std::string> Line() {
    const size_t end = in_.find('\n', pos_);
    if (end == absl::string_view::npos) return Bad("truncated pickle");
    std::string s(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  absl::StatusOr<Value> Pop() {
    if (stack_.empty() || stack_.back()->kind == PickleValue::kMark) {
      return Bad("malformed pickle (an empty stack)");
    }
    Value v = stack_.back();
    stack_.pop_back();
    return v;
  }
  // The values above the topmost mark, which is removed.
  absl::StatusOr<std::vector<Value>> PopToMark() {
    std::vector<Value> items;
    while (!stack_.empty() && stack_.back()->kind != PickleValue::kMark) {
      items.insert(items.begin(), stack_.back());
      stack_.pop_back();
    }
    if (stack_.empty()) return Bad("malformed pickle (no mark)");
    stack_.pop_back();
    return items;
  }
  void Push(Value v) { stack_.push_back(std::move(v)); }
  Value Tuple(std::vector<Value> items) {
    Value t = Make(PickleValue::kTuple);
    t->items = std::move(items);
    return t;
  }

  absl::Status Step(unsigned char op);
  absl::Status Reduce();
  absl::Status Build();

  absl::string_view in_;
  absl::string_view name_;
  size_t pos_ = 0;
  std::vector<Value> stack_;
  std::map<uint64_t, Value> memo_;
};

absl::Status ObjectUnpickler::Step(unsigned char op) {
  switch (op) {
    case 0x80:
      return Unsigned(1).status();  // PROTO
    case 0x95:
      return Unsigned(8).status();  // FRAME
    case '(':
      Push(Make(PickleValue::kMark));
      return absl::OkStatus();
    case 'N':
      Push(Make(PickleValue::kNone));
      return absl::OkStatus();
    case 0x88:
    case 0x89: {  // NEWTRUE, NEWFALSE
      Value v = Make(PickleValue::kBool);
      v->number = op == 0x88;
      Push(v);
      return absl::OkStatus();
    }
    case 'K':
    case 'M':
    case 'J': {  // BININT1, BININT2, BININT
      ASSIGN_OR_RETURN(const uint64_t raw, Unsigned(op == 'K' ? 1 : op == 'M' ? 2 : 4));
      Value v = Make(PickleValue::kInt);
      v->number =
          op == 'J' ? static_cast<int64_t>(static_cast<int32_t>(raw)) : static_cast<int64_t>(raw);
      Push(v);
      return absl::OkStatus();
    }
    case 0x8a: {  // LONG1
      ASSIGN_OR_RETURN(const uint64_t n, Unsigned(1));
      if (n > 8) return Bad("an integer wider than 64 bits");
      ASSIGN_OR_RETURN(const uint64_t raw, Unsigned(n));
      Value v = Make(PickleValue::kInt);
      v->number = n == 0 ? 0 : static_cast<int64_t>(raw << (64 - 8 * n)) >> (64 - 8 * n);
      Push(v);
      return absl::OkStatus();
    }
    case 'X':
    case 0x8c:
    case 'C':
    case 'B':
    case 0x8e: {  // strings and bytes
      const size_t width = op == 0x8c || op == 'C' ? 1 : op == 0x8e ? 8 : 4;
      ASSIGN_OR_RETURN(const uint64_t n, Unsigned(width));
      Value v = Make(op == 'X' || op == 0x8c ? PickleValue::kStr : PickleValue::kBytes);
      ASSIGN_OR_RETURN(v->text, Raw(n));
      Push(v);
      return absl::OkStatus();
    }
    case 'c': {  // GLOBAL
      ASSIGN_OR_RETURN(const std::string module, Line());
      ASSIGN_OR_RETURN(const std::string attr, Line());
      Value v = Make(PickleValue::kGlobal);
      v->text = absl::StrCat(module, " ", attr);
      Push(v);
      return absl::OkStatus();
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(const Value attr, Pop());
      ASSIGN_OR_RETURN(const Value module, Pop());
      Value v = Make(PickleValue::kGlobal);
      v->text = absl::StrCat(module->text, " ", attr->text);
      Push(v);
      return absl::OkStatus();
    }
    case 'q':
    case 'r': {  // BINPUT, LONG_BINPUT
      ASSIGN_OR_RETURN(const uint64_t key, Unsigned(op == 'q' ? 1 : 4));
      if (stack_.empty()) return Bad("malformed pickle (a put with an empty stack)");
      memo_[key] = stack_.back();
      return absl::OkStatus();
    }
    case 0x94:  // MEMOIZE
      if (stack_.empty()) return Bad("malformed pickle (a put with an empty stack)");
      memo_[memo_.size()] = stack_.back();
      return absl::OkStatus();
    case 'h':
    case 'j': {  // BINGET, LONG_BINGET
      ASSIGN_OR_RETURN(const uint64_t key, Unsigned(op == 'h' ? 1 : 4));
      auto it = memo_.find(key);
      if (it == memo_.end()) return Bad("malformed pickle (a get of nothing)");
      Push(it->second);
      return absl::OkStatus();
    }
    case ')':
      Push(Tuple({}));
      return absl::OkStatus();
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<Value> items(op - 0x84);
      for (size_t i = items.size(); i-- > 0;) {
        ASSIGN_OR_RETURN(items[i], Pop());
      }
      Push(Tuple(std::move(items)));
      return absl::OkStatus();
    }
    case 't': {  // TUPLE
      ASSIGN_OR_RETURN(std::vector<Value> items, PopToMark());
      Push(Tuple(std::move(items)));
      return absl::OkStatus();
    }
    case ']':
      Push(Make(PickleValue::kList));
      return absl::OkStatus();
    case 'a':
    case 'e': {  // APPEND, APPENDS
      std::vector<Value> items;
      if (op == 'a') {
        ASSIGN_OR_RETURN(Value v, Pop());
        items.push_back(std::move(v));
      } else {
        ASSIGN_OR_RETURN(items, PopToMark());
      }
      if (stack_.empty() || stack_.back()->kind != PickleValue::kList) {
        return Bad("malformed pickle (an append to no list)");
      }
      for (Value& v : items) stack_.back()->items.push_back(std::move(v));
      return absl::OkStatus();
    }
    case 'R':
      return Reduce();
    case 'b':
      return Build();
    default:
      return Bad(absl::StrCat("pickle opcode 0x", absl::Hex(op),
                              " is not one numpy's arrays use; refused"));
  }
}

// Calls a global: only numpy's array reconstruction and dtype.
absl::Status ObjectUnpickler::Reduce() {
  ASSIGN_OR_RETURN(const Value args, Pop());
  ASSIGN_OR_RETURN(const Value callable, Pop());
  if (callable->kind != PickleValue::kGlobal || args->kind != PickleValue::kTuple) {
    return Bad("malformed pickle (a call of a non-global)");
  }
  if (IsReconstruct(callable->text)) {
    Push(Make(PickleValue::kArray));
    return absl::OkStatus();
  }
  if (callable->text == "numpy dtype" && !args->items.empty() &&
      args->items[0]->kind == PickleValue::kStr) {
    Value dtype = Make(PickleValue::kDtype);
    dtype->text = args->items[0]->text;
    Push(dtype);
    return absl::OkStatus();
  }
  return Bad(absl::StrCat("the pickle calls '", callable->text,
                          "'; only numpy arrays of integer arrays are read"));
}

// Sets an array's or a dtype's state.
absl::Status ObjectUnpickler::Build() {
  ASSIGN_OR_RETURN(const Value state, Pop());
  if (stack_.empty()) return Bad("malformed pickle (a BUILD of nothing)");
  PickleValue& target = *stack_.back();
  if (state->kind != PickleValue::kTuple) return Bad("malformed pickle (a state not a tuple)");
  if (target.kind == PickleValue::kDtype) {
    if (state->items.size() > 1 && state->items[1]->kind == PickleValue::kStr &&
        state->items[1]->text.size() == 1) {
      target.byteorder = state->items[1]->text[0];
    }
    return absl::OkStatus();
  }
  if (target.kind != PickleValue::kArray || state->items.size() != 5) {
    return Bad("malformed pickle (a state for something other than an array or dtype)");
  }
  target.items = {state};
  return absl::OkStatus();
}

// An element (a row): a 1-D int32/int64 array, or a list of integers.
absl::StatusOr<std::vector<int64_t>> RowOf(const PickleValue& v, const std::string& where) {
  std::vector<int64_t> row;
  if (v.kind == PickleValue::kList) {
    for (const Value& item : v.items) {
      if (item->kind != PickleValue::kInt) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a list of other than integers"));
      }
      row.push_back(item->number);
    }
    return row;
  }
  if (v.kind != PickleValue::kArray || v.items.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": neither an integer array nor a list of integers"));
  }
  const std::vector<Value>& s = v.items[0]->items;  // (version, shape, dtype, fortran, data)
  const PickleValue& shape = *s[1];
  const PickleValue& dtype = *s[2];
  const bool width4 = dtype.text == "i4", width8 = dtype.text == "i8";
  if (shape.kind != PickleValue::kTuple || shape.items.size() != 1 ||
      dtype.kind != PickleValue::kDtype || !(width4 || width8) || dtype.byteorder == '>' ||
      s[4]->kind != PickleValue::kBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a 1-D little-endian int32 or int64 array (dtype ",
                     dtype.kind == PickleValue::kDtype ? dtype.text : std::string("?"), ")"));
  }
  const int64_t n = shape.items[0]->number;
  const size_t width = width4 ? 4 : 8;
  if (n < 0 || s[4]->text.size() != static_cast<size_t>(n) * width) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": its data is not ", n, " ids"));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (width4) {
      int32_t x;
      std::memcpy(&x, s[4]->text.data() + 4 * i, 4);
      row.push_back(x);
    } else {
      int64_t x;
      std::memcpy(&x, s[4]->text.data() + 8 * i, 8);
      row.push_back(x);
    }
  }
  return row;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int64_t>>> ParseObjectArrayRows(
    absl::string_view pickle, const std::vector<int64_t>& shape, absl::string_view name) {
  if (shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": an object array of ragged rows is 1-D, this one has ", shape.size(),
                     " dimensions"));
  }
  ASSIGN_OR_RETURN(const Value root, ObjectUnpickler(pickle, name).Run());
  if (root->kind != PickleValue::kArray || root->items.empty() ||
      root->items[0]->items[4]->kind != PickleValue::kList) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": object array: the pickle holds no object array"));
  }
  const std::vector<Value>& elements = root->items[0]->items[4]->items;
  if (static_cast<int64_t>(elements.size()) != shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the header says ", shape[0],
                                                   " rows, the pickle holds ", elements.size()));
  }
  std::vector<std::vector<int64_t>> rows;
  for (size_t i = 0; i < elements.size(); ++i) {
    ASSIGN_OR_RETURN(std::vector<int64_t> row,
                     RowOf(*elements[i], absl::StrCat(name, ": row ", i)));
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace stagecoach::client
