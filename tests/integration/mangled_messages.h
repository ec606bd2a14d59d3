// Valid protobuf messages made invalid at random, for tests that check a
// server answers every request and crashes on none: bytes flipped, cut or
// inserted (most no longer parse), or one field set to an edge value (the
// message parses, and reaches the service's own checks).
#ifndef KVTIER_TESTS_INTEGRATION_MANGLED_MESSAGES_H_
#define KVTIER_TESTS_INTEGRATION_MANGLED_MESSAGES_H_

#include <google/protobuf/message.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>

namespace kvtier::testing {

// 1-4 random edits of a serialized message.
inline std::string Mutate(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 5) {
      case 0:  // one bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:  // one byte
        if (!s.empty()) s[at] = static_cast<char>(rng());
        break;
      case 2:  // cut off
        s.resize(rng() % (s.size() + 1));
        break;
      case 3:  // bytes inserted
        for (size_t n = 1 + rng() % 8; n > 0; --n) s.insert(at, 1, static_cast<char>(rng()));
        break;
      case 4:  // all ones: lengths and varints at their largest
        for (size_t i = at; i < std::min(s.size(), at + 1 + rng() % 8); ++i) s[i] = '\xff';
        break;
    }
  }
  return s;
}

// A value at an edge, or random.
template <typename Int>
Int EdgeValue(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return std::numeric_limits<Int>::max();
    case 3:
      return std::numeric_limits<Int>::min();
    default:
      return static_cast<Int>(rng());
  }
}

// One field of `m` (at any depth) set to an edge or random value, cleared,
// or (repeated) grown, cut or emptied: a request that still parses, for the
// services' own checks.
inline void MutateField(google::protobuf::Message& m, std::mt19937_64& rng) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* type = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  if (type->field_count() == 0) return;
  const FieldDescriptor* f = type->field(static_cast<int>(rng() % type->field_count()));
  if (f->is_repeated()) {
    const int n = r->FieldSize(m, f);
    switch (rng() % 4) {
      case 0:
        r->ClearField(&m, f);
        return;
      case 1:
        if (n > 0) r->RemoveLast(&m, f);
        return;
      case 2:  // a copy of an element, changed or not
        if (n > 0 && f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          google::protobuf::Message* added = r->AddMessage(&m, f);
          added->CopyFrom(r->GetRepeatedMessage(m, f, static_cast<int>(rng() % n)));
          if (rng() % 2) MutateField(*added, rng);
        } else if (n > 0 && f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          r->AddString(&m, f, r->GetRepeatedString(m, f, static_cast<int>(rng() % n)));
        } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
          r->AddUInt32(&m, f, EdgeValue<uint32_t>(rng));
        }
        return;
      default:  // one element changed
        if (n == 0) return;
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
          MutateField(*r->MutableRepeatedMessage(&m, f, static_cast<int>(rng() % n)), rng);
        } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
          r->SetRepeatedUInt32(&m, f, static_cast<int>(rng() % n), EdgeValue<uint32_t>(rng));
        } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          std::string v = r->GetRepeatedString(m, f, static_cast<int>(rng() % n));
          if (!v.empty()) v[rng() % v.size()] ^= 1;
          r->SetRepeatedString(&m, f, static_cast<int>(rng() % n), v);
        }
        return;
    }
  }
  if (rng() % 6 == 0) {
    r->ClearField(&m, f);
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      MutateField(*r->MutableMessage(&m, f), rng);
      return;
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(&m, f, EdgeValue<int32_t>(rng));
      return;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(&m, f, EdgeValue<int64_t>(rng));
      return;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(&m, f, EdgeValue<uint32_t>(rng));
      return;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(&m, f, EdgeValue<uint64_t>(rng));
      return;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(&m, f, !r->GetBool(m, f));
      return;
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float edges[] = {
          0.0f, -1.0f, 1e30f, -1e-30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
      r->SetFloat(&m, f, edges[rng() % 6]);
      return;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(&m, f, static_cast<double>(EdgeValue<int64_t>(rng)));
      return;
    case FieldDescriptor::CPPTYPE_ENUM:
      r->SetEnumValue(&m, f, EdgeValue<int32_t>(rng) % 8);
      return;
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string v = r->GetString(m, f);
      switch (rng() % 4) {
        case 0:
          v.resize(v.empty() ? 0 : rng() % v.size());
          break;
        case 1:
          v += std::string(1 + rng() % 64, static_cast<char>(rng()));
          break;
        case 2:
          if (!v.empty()) v[rng() % v.size()] = static_cast<char>(rng());
          break;
        default:
          v = std::string(rng() % 40, 'a' + static_cast<char>(rng() % 26));
          break;
      }
      r->SetString(&m, f, v);
      return;
    }
  }
}

// Half the time bytes mangled (Mutate), half one field (MutateField).
inline std::string Mangled(const google::protobuf::Message& valid, std::mt19937_64& rng) {
  if (rng() % 2) return Mutate(valid.SerializeAsString(), rng);
  std::unique_ptr<google::protobuf::Message> m(valid.New());
  m->CopyFrom(valid);
  for (int n = 1 + static_cast<int>(rng() % 2); n > 0; --n) MutateField(*m, rng);
  return m->SerializeAsString();
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_MANGLED_MESSAGES_H_
