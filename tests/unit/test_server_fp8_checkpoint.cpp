// `kiln serve` on a block-FP8 checkpoint read from disk (every other serve test and benchmark runs
// `--load-format random --quantization fp8`): `kiln demo-model --quantization fp8` writes Qwen's -FP8 layout,
// `kiln serve --device cpu` serves it on 127.0.0.1 at an ephemeral port (--port 0, read from its READY line),
// and greedy /generate and /v1/completions answers equal `kiln generate` on the same checkpoint token for
// token and log-prob for log-prob. Those equal online quantization of the BF16 source bit for bit and differ
// from the BF16 model's, so the server ran the checkpoint's FP8 weights. The same for the Qwen3-VL FP8 demo
// (text decoder FP8, vision tower BF16). SIGTERM then stops the server with status 0, every request accounted
// for.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/kiln_process.h"
#include "common/test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

using kiln::test_support::kiln_bin;
using kiln::test_support::slurp;

// This process's scratch folder (removed at exit): ctest runs each TEST as its own process.
fs::path scratch() {
  return kiln::test_support::process_scratch_dir("server_fp8_ckpt");
}

kiln::test_support::KilnResult run_kiln(const std::vector<std::string>& args) {
  return kiln::test_support::run_kiln(args, scratch());
}

// `kiln serve --model MODEL --device cpu --port 0` as a child process, stdout and stderr in files of the
// scratch folder. Killed (SIGKILL) by the destructor if stop() did not end it.
class ServeProcess {
 public:
  explicit ServeProcess(const fs::path& model)
      : out_(scratch() / "serve.out"), err_(scratch() / "serve.err") {
    std::vector<std::string> args = {kiln_bin(), "serve", "--model", model.string(), "--device", "cpu"};
    // Loopback at an ephemeral port; a small KV pool, as tests share the machine.
    for (const char* a :
         {"--host", "127.0.0.1", "--port", "0", "--max-total-tokens", "4096", "--max-context-len", "1024"})
      args.push_back(a);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      ADD_FAILURE() << "cannot start " << args[0] << ": " << std::strerror(rc);
      return;
    }
    // CPU start-up of the demo takes about a second; 60 s bounds a loaded machine.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string text = slurp(out_);
      const std::string ready = "READY http://127.0.0.1:";
      if (const size_t at = text.find(ready);
          at != std::string::npos && text.find('\n', at) != std::string::npos) {
        port_ = std::stoi(text.substr(at + ready.size()));
        return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "kiln serve exited before it was ready:\n" << slurp(err_);
        return;
      }
      std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "kiln serve not ready after 60 s:\n" << slurp(err_);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  std::string log() const { return slurp(err_); }

  // SIGTERM (the server drains, then exits): its exit status, or -1 if it was signalled or still ran after
  // 30 s.
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  int port_ = 0;
};

json post(int port, const std::string& path, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(60, 0);
  const auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r) << path << ": no response";
  if (!r) return json{};
  EXPECT_EQ(r->status, 200) << path << ": " << r->body;
  return r->status == 200 ? json::parse(r->body) : json{};
}

const std::vector<int> kPromptIds = {9707, 11, 1879, 0};
constexpr const char* kPromptText = "The kiln fires at";
constexpr int kTokens = 8;

// `kiln generate --json` greedy on `model` (ids or text prompt), plus `extra` flags.
json generate(const fs::path& model, bool text_prompt, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"generate",    "--model", model.string(), "--json",
                                   "--device",    "cpu",     "--max-tokens", std::to_string(kTokens),
                                   "--ignore-eos"};
  if (text_prompt) {
    args.insert(args.end(), {"--prompt", kPromptText});
  } else {
    std::string ids;
    for (int id : kPromptIds) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    args.insert(args.end(), {"--prompt-ids", ids});
  }
  args.insert(args.end(), extra.begin(), extra.end());
  const auto r = run_kiln(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? json::parse(r.out) : json{};
}

// Writes the FP8 demo and its BF16 source (`arch`: qwen3 or vl, seed 6), serves the FP8 one and checks the
// server's greedy answers against `kiln generate` on it.
void check_served_fp8_demo(const std::string& arch) {
  if (!fs::exists(kiln_bin())) GTEST_SKIP() << "kiln binary not built at " << kiln_bin();
  const fs::path fp8 = scratch() / arch / "fp8", bf16 = scratch() / arch / "bf16";
  for (const auto& [dir, quant] : {std::pair{fp8, "fp8"}, std::pair{bf16, "none"}}) {
    const auto r =
        run_kiln({"demo-model", dir.string(), "--arch", arch, "--seed", "6", "--quantization", quant});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  ASSERT_EQ(json::parse(slurp(fp8 / "config.json"))["quantization_config"]["quant_method"], "fp8");

  // The reference, run before the server starts: the same checkpoint through `kiln generate`; it is online
  // quantization of the BF16 source (bitwise) and not the BF16 model.
  const json want = generate(fp8, false), want_text = generate(fp8, true);
  ASSERT_EQ(want["ids"].size(), size_t(kTokens));
  ASSERT_EQ(want["logprobs"].size(), size_t(kTokens));
  EXPECT_EQ(generate(bf16, false, {"--quantization", "fp8"})["logprobs"], want["logprobs"]);
  EXPECT_NE(generate(bf16, false)["logprobs"], want["logprobs"]);

  ServeProcess server(fp8);
  ASSERT_GT(server.port(), 0);
  const json gen =
      post(server.port(), "/generate",
           {{"input_ids", kPromptIds},
            {"sampling_params", {{"max_new_tokens", kTokens}, {"temperature", 0}, {"ignore_eos", true}}},
            {"return_logprob", true}});
  EXPECT_EQ(gen["output_ids"], want["ids"]);
  ASSERT_EQ(gen["meta_info"]["output_token_logprobs"].size(), size_t(kTokens)) << gen.dump();
  for (int i = 0; i < kTokens; ++i) {
    const json& lp = gen["meta_info"]["output_token_logprobs"][size_t(i)];  // [logprob, id, text]
    EXPECT_EQ(lp[0], want["logprobs"][size_t(i)]) << "token " << i;
    EXPECT_EQ(lp[1], want["ids"][size_t(i)]) << "token " << i;
  }
  EXPECT_EQ(gen["meta_info"]["finish_reason"]["type"], "length");

  const json ids = post(server.port(), "/v1/completions",
                        {{"prompt", kPromptIds},
                         {"max_tokens", kTokens},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"logprobs", 0}});
  ASSERT_EQ(ids["choices"].size(), 1u) << ids.dump();
  EXPECT_EQ(ids["choices"][0]["logprobs"]["token_logprobs"], want["logprobs"]);
  EXPECT_EQ(ids["choices"][0]["text"], want["text"]);
  EXPECT_EQ(ids["usage"]["completion_tokens"], kTokens);

  const json text = post(server.port(), "/v1/completions",
                         {{"prompt", kPromptText},
                          {"max_tokens", kTokens},
                          {"temperature", 0},
                          {"ignore_eos", true},
                          {"logprobs", 0}});
  ASSERT_EQ(text["choices"].size(), 1u) << text.dump();
  EXPECT_EQ(text["choices"][0]["text"], want_text["text"]);
  EXPECT_EQ(text["choices"][0]["logprobs"]["token_logprobs"], want_text["logprobs"]);
  EXPECT_EQ(text["usage"]["prompt_tokens"], want_text["prompt_tokens"]);
  EXPECT_EQ(text["usage"]["completion_tokens"], kTokens);

  EXPECT_EQ(server.stop(), 0) << server.log();
  EXPECT_NE(server.log().find("accepted 3: completed 3, error 0, aborted 0"), std::string::npos)
      << server.log();
}

}  // namespace

TEST(ServeFp8Checkpoint, Qwen3GreedyAnswersEqualKilnGenerate) {
  check_served_fp8_demo("qwen3");
}

TEST(ServeFp8Checkpoint, Qwen3VlGreedyAnswersEqualKilnGenerate) {
  check_served_fp8_demo("vl");
}
