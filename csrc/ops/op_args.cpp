#include "ops/op_args.h"

namespace ukv::ops {

std::string make_schema(const char* name, const std::vector<SchemaArg>& args) {
  std::string s = std::string(name) + "(";
  bool keyword = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) s += ", ";
    if (args[i].is_int && !keyword) {
      s += "*, ";
      keyword = true;
    }
    s += args[i].text;
  }
  return s + ") -> ()";
}

}  // namespace ukv::ops
