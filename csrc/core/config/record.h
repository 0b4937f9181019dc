// Records: plain configuration structs (ServeConfig, PoolSizes, KvPlan) whose
// fields are listed once, in a visit_fields(record, visitor) overload beside
// the struct. The visitors here turn that one list into the serialised form
// (written and read with state_io, validated after reading) and into the
// description ukv_torch builds its Python classes from, so adding a field is
// one line in one place.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/config/state_io.h"

namespace ukv {

// Specialised beside each record: its name, its state kind and its validation.
template <class R>
struct RecordTraits;

// Longest list field a record may hold (a plan lists one value per layer).
constexpr int64_t kMaxRecordList = int64_t{1} << 20;

struct RecordWriter {
  StateWriter& w;
  void integer(const char*, int64_t v, const char*) { w.put(v); }
  void integers(const char*, const std::vector<int64_t>& v, const char*) { w.put_vec(v); }
  template <class E>
  void choice(const char*, E v, std::initializer_list<const char*>, const char*) { w.put(static_cast<int64_t>(v)); }
  void flag(const char*, bool v, const char*) { w.put(v); }
  void real(const char*, double v, const char*) { w.put_real(v); }
  template <class R>
  void record(const char*, const R& r, const char*) { R::visit_fields(r, *this); }
};

struct RecordReader {
  StateReader& r;
  void integer(const char*, int64_t& v, const char*) { v = r.next(); }
  void integers(const char* name, std::vector<int64_t>& v, const char*) { v = r.vec<int64_t>(kMaxRecordList, name); }
  template <class E>
  void choice(const char* name, E& v, std::initializer_list<const char*> names, const char*) {
    v = static_cast<E>(r.in_range(0, static_cast<int64_t>(names.size()) - 1, name));
  }
  void flag(const char* name, bool& v, const char*) { v = r.flag(name); }
  void real(const char*, double& v, const char*) { v = r.real(); }
  template <class R>
  void record(const char*, R& rec, const char*) { R::visit_fields(rec, *this); }
};

// One field as the Python side sees it: kind is int, ints, bool, float,
// choice (with its names) or the name of a nested record.
struct FieldDescription {
  std::string name, kind, doc;
  std::vector<std::string> choices;
};

struct RecordDescriber {
  std::vector<FieldDescription>& out;
  void integer(const char* n, int64_t, const char* d) { out.push_back({n, "int", d, {}}); }
  void integers(const char* n, const std::vector<int64_t>&, const char* d) { out.push_back({n, "ints", d, {}}); }
  template <class E>
  void choice(const char* n, E, std::initializer_list<const char*> names, const char* d) {
    out.push_back({n, "choice", d, std::vector<std::string>(names.begin(), names.end())});
  }
  void flag(const char* n, bool, const char* d) { out.push_back({n, "bool", d, {}}); }
  void real(const char* n, double, const char* d) { out.push_back({n, "float", d, {}}); }
  template <class R>
  void record(const char* n, const R&, const char* d) { out.push_back({n, RecordTraits<R>::name, d, {}}); }
};

// The serialised record: a state header of its kind, then its fields.
template <class R>
std::vector<int64_t> encode_record(const R& rec) {
  std::vector<int64_t> out;
  StateWriter w(out);
  begin_state(w, RecordTraits<R>::kind);
  R::visit_fields(rec, RecordWriter{w});
  return out;
}

// Reads, checks for leftovers, and validates a serialised record.
template <class R>
R decode_record(const std::vector<int64_t>& encoded) {
  StateReader r = open_state(encoded, RecordTraits<R>::kind);
  R rec;
  R::visit_fields(rec, RecordReader{r});
  r.finish();
  RecordTraits<R>::validate(rec);
  return rec;
}

template <class R>
std::vector<FieldDescription> describe_record() {
  std::vector<FieldDescription> out;
  const R defaults{};
  R::visit_fields(defaults, RecordDescriber{out});
  return out;
}

}  // namespace ukv
