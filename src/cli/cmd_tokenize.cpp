// kiln tokenize / detokenize / chat-template: the tokenizer on stdin and stdout.
//   tokenize --model DIR                 UTF-8 text -> JSON array of ids
//   tokenize --model DIR --input-json    JSON array of strings -> JSON array of id arrays
//   tokenize --model DIR --bench [--repeat N]   single-thread encode throughput of stdin, as one JSON line
//   detokenize --model DIR [--skip-special-tokens] [--stream]   JSON id array -> the text, nothing appended
//   chat-template --model DIR            {messages, tools?, add_generation_prompt?, enable_thinking?} -> text
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "cli/flags.h"
#include "kiln/error.h"
#include "kiln/json_depth.h"
#include "kiln/tokenizer.h"

namespace {

using nlohmann::json;

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void write_stdout(const std::string& s) {
  KILN_CHECK(std::fwrite(s.data(), 1, s.size(), stdout) == s.size(), "write to stdout failed");
  std::fflush(stdout);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

json parse_json(const std::string& s, const char* what) {
  kiln::check_json_depth(s, "stdin");
  try {
    return json::parse(s);
  } catch (const json::exception& e) {
    KILN_FAIL("stdin is not valid JSON (", what, "): ", e.what());
  }
}

int run_tokenize(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"model", "repeat"}, {"input-json", "bench"});
  const auto tk = kiln::Tokenizer::load(f.required("model"));
  const std::string in = read_stdin();
  if (f.flag("bench")) {
    // Best of N single-threaded passes over the whole input. Thread CPU time is reported beside wall time
    // because the CI-class machine is shared: its wall clock counts other people's processes too.
    const int64_t reps = f.i64("repeat", 3);
    KILN_CHECK(reps >= 1, "--repeat must be >= 1");
    double best_wall = 1e300, best_cpu = 1e300;
    size_t tokens = 0;
    for (int64_t r = 0; r < reps; ++r) {
      const double c0 = thread_cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      tokens = tk.encode(in).size();
      best_wall =
          std::min(best_wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      best_cpu = std::min(best_cpu, thread_cpu_seconds() - c0);
    }
    const double mb = double(in.size()) / 1e6;
    write_stdout(json({{"bytes", in.size()},
                       {"tokens", tokens},
                       {"wall_s", best_wall},
                       {"cpu_s", best_cpu},
                       {"mb_per_s_wall", mb / best_wall},
                       {"mb_per_s_cpu", mb / best_cpu}})
                     .dump() +
                 "\n");
    return 0;
  }
  if (f.flag("input-json")) {
    const json j = parse_json(in, "expected an array of strings");
    KILN_CHECK(j.is_array(), "--input-json: stdin must be a JSON array of strings");
    json out = json::array();
    for (size_t i = 0; i < j.size(); ++i) {
      KILN_CHECK(j[i].is_string(), "--input-json: element ", i, " is not a string");
      out.push_back(tk.encode(j[i].get<std::string>()));
    }
    write_stdout(out.dump() + "\n");
    return 0;
  }
  write_stdout(json(tk.encode(in)).dump() + "\n");
  return 0;
}

int run_detokenize(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"model"}, {"skip-special-tokens", "stream"});
  const auto tk = kiln::Tokenizer::load(f.required("model"));
  const json j = parse_json(read_stdin(), "expected an array of ids");
  KILN_CHECK(j.is_array(), "stdin must be a JSON array of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    KILN_CHECK(j[i].is_number_integer(), "element ", i, " is not an integer token id");
    const int64_t v = j[i].get<int64_t>();
    KILN_CHECK(v >= 0 && v < tk.vocab_size(), "token id ", v, " at position ", i, " is out of range [0, ",
               tk.vocab_size(), ")");
    ids.push_back(int32_t(v));
  }
  const bool skip = f.flag("skip-special-tokens");
  if (f.flag("stream")) {  // emit as the streaming detokenizer would, piece by piece
    kiln::StreamDecoder sd(tk, skip);
    for (int32_t id : ids) write_stdout(sd.push(id));
    write_stdout(sd.flush());
  } else {
    write_stdout(tk.decode(ids, skip));
  }
  return 0;
}

int run_chat_template(const kiln::cli::Args& args) {
  const kiln::cli::Flags f(args, {"model"});
  const auto tk = kiln::Tokenizer::load(f.required("model"));
  write_stdout(tk.render_chat(read_stdin()));
  return 0;
}

}  // namespace

KILN_COMMAND("tokenize", "UTF-8 text on stdin -> JSON ids (--input-json: strings -> id arrays; --bench)",
             run_tokenize);
KILN_COMMAND("detokenize", "JSON id array on stdin -> text (--skip-special-tokens, --stream)",
             run_detokenize);
KILN_COMMAND("chat-template", "chat request JSON on stdin -> the prompt rendered by the Qwen3 template",
             run_chat_template);
