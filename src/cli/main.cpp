// kiln: one binary, subcommands registered by the cmd_*.cpp files.
#include <cstdio>
#include <exception>

#include "cli/command.h"
#include "cli/flags.h"

namespace kiln::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}
const std::vector<Command>& commands() {
  return registry();
}

static void usage() {
  std::fprintf(stderr, "usage: kiln <command> [flags]\n\ncommands:\n");
  for (const auto& c : commands()) std::fprintf(stderr, "  %-18s %s\n", c.name.c_str(), c.summary.c_str());
}

// `kiln CMD --help` for a command whose own parser does not take --help: its summary and its flags.
static void command_help(const Command& c, const HelpRequested& h) {
  std::printf("usage: kiln %s [flags]\n\n%s\n", c.name.c_str(), c.summary.c_str());
  if (!h.value_flags.empty()) std::printf("\nflags taking a value:\n");
  for (const auto& f : h.value_flags) std::printf("  --%s VALUE\n", f.c_str());
  if (!h.bool_flags.empty()) std::printf("\nswitches:\n");
  for (const auto& f : h.bool_flags) std::printf("  --%s\n", f.c_str());
}

}  // namespace kiln::cli

int main(int argc, char** argv) {
  using namespace kiln::cli;
  kiln::cli::Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage();
    return args.empty() ? 2 : 0;
  }
  // Longest matching command name ("bench serve" before "bench").
  const Command* best = nullptr;
  size_t best_words = 0;
  for (const auto& c : commands()) {
    size_t words = 0, pos = 0;
    bool ok = true;
    while (ok && pos <= c.name.size()) {
      const size_t sp = c.name.find(' ', pos);
      const std::string w = c.name.substr(pos, sp == std::string::npos ? std::string::npos : sp - pos);
      ok = words < args.size() && args[words] == w;
      ++words;
      if (sp == std::string::npos) break;
      pos = sp + 1;
    }
    if (ok && words > best_words) {
      best = &c;
      best_words = words;
    }
  }
  if (!best) {
    std::fprintf(stderr, "kiln: unknown command '%s'\n", args[0].c_str());
    usage();
    return 2;
  }
  try {
    return best->run(Args(args.begin() + long(best_words), args.end()));
  } catch (const HelpRequested& h) {
    command_help(*best, h);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln %s: error: %s\n", best->name.c_str(), e.what());
    return 1;
  }
}
