// A fuzz target without libFuzzer (every build but scripts/fuzz.sh's, and
// ctest): runs its seeds, then --mutations N inputs made from them (bytes
// flipped, set, cut, inserted, repeated or spliced from another seed, one
// to four changes each, drawn from a seed printed first, so that
// KVTIER_TEST_SEED replays a failure), then every file named and every
// file in a directory named (inputs libFuzzer once found; none is fine).
// An input that breaks a property or crashes the target is written to
// fuzz-failure-<target>-<seed> in the working directory, a file both this
// driver and scripts/fuzz.sh's libFuzzer build take as an argument.
// Protobuf's complaints about malformed messages are silenced.
#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// A sanitizer reports the faults it finds, then aborts rather than exits
// (its options from the environment still apply on top), so that the
// SIGABRT handler below writes the input.
extern "C" const char* __asan_default_options() { return "abort_on_error=1"; }
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1"; }
extern "C" const char* __tsan_default_options() { return "abort_on_error=1"; }
#define KVTIER_REPLAY_SANITIZED 1
#endif

namespace {

// The input being run, and where it goes if it fails.
std::atomic<const std::string*> running{nullptr};  // lock-free: a signal handler reads it
char failure_path[4096];

// Writes the running input to failure_path: only calls a signal handler
// may make (open, write, close).
void SaveRunningInput() {
  const std::string* input = running.exchange(nullptr);  // once
  if (input == nullptr) return;
  const int fd = open(failure_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  const char* at = input->data();
  for (size_t left = input->size(); left > 0;) {
    const ssize_t n = write(fd, at, left);
    if (n <= 0) break;
    at += n, left -= static_cast<size_t>(n);
  }
  close(fd);
  constexpr char kSaid[] = "failing input written to ";
  (void)!write(STDERR_FILENO, kSaid, sizeof kSaid - 1);
  (void)!write(STDERR_FILENO, failure_path, strlen(failure_path));
  (void)!write(STDERR_FILENO, "\n", 1);
}

void OnFatalSignal(int signal_number) {
  SaveRunningInput();
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

// A broken property aborts; so does a sanitizer that found a fault. An
// unsanitized crash is a signal.
void SaveFailingInputs(const char* program, uint64_t seed) {
  const std::string path =
      (std::filesystem::current_path() /
       ("fuzz-failure-" + std::filesystem::path(program).filename().string() + "-" + std::to_string(seed)))
          .string();
  std::snprintf(failure_path, sizeof failure_path, "%s", path.c_str());
  std::signal(SIGABRT, OnFatalSignal);
#ifndef KVTIER_REPLAY_SANITIZED
  for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(signal_number, OnFatalSignal);
#endif
}

void Run(const std::string& input) {
  running = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  running = nullptr;
}

std::string Mutated(const std::vector<std::string>& seeds, std::mt19937_64& rng) {
  std::string s = seeds[rng() % seeds.size()];
  for (size_t changes = 1 + rng() % 4; changes > 0; --changes) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 6) {
      case 0:
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1: {
        static constexpr char kEdges[] = {0, 1, 0x7f, static_cast<char>(0x80), static_cast<char>(0xff)};
        if (!s.empty()) s[at] = kEdges[rng() % sizeof(kEdges)];
        break;
      }
      case 2:
        s.resize(at);
        break;
      case 3:
        for (size_t n = 1 + rng() % 8; n > 0; --n)
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), static_cast<char>(rng()));
        break;
      case 4:
        s.insert(at, s.substr(at, rng() % 64));
        break;
      default: {
        const std::string& other = seeds[rng() % seeds.size()];
        s = s.substr(0, at) + other.substr(other.empty() ? 0 : rng() % other.size());
      }
    }
  }
  return s;
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  size_t mutations = 0;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::stoul(argv[++i]);
    } else if (arg.starts_with("-")) {
      std::cerr << "usage: " << argv[0] << " [--mutations N] [file or directory of inputs ...]\n";
      return 2;
    } else {
      paths.emplace_back(arg);
    }
  }
  google::protobuf::SetLogHandler(nullptr);
  const std::vector<std::string> seeds = kvtier::fuzz::Seeds();
  uint64_t seed = std::random_device{}();
  if (const char* env = std::getenv("KVTIER_TEST_SEED")) seed = std::strtoull(env, nullptr, 10);
  std::cout << "KVTIER_TEST_SEED=" << seed << std::endl;
  SaveFailingInputs(argv[0], seed);
  std::mt19937_64 rng(seed);
  for (const std::string& s : seeds) Run(s);
  for (size_t i = 0; i < mutations && !seeds.empty(); ++i) Run(Mutated(seeds, rng));
  size_t files = 0;
  for (const std::filesystem::path& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        Run(Read(entry.path()));
        ++files;
      }
    } else if (std::filesystem::exists(path)) {
      Run(Read(path));
      ++files;
    }
  }
  std::cout << seeds.size() << " seeds, " << mutations << " mutations, " << files
            << " saved inputs: every property held\n";
  return 0;
}
