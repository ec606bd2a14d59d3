// A fuzz target without libFuzzer (every build but scripts/fuzz.sh's, and
// ctest): runs its seeds, then --mutations N inputs made from them (bytes
// flipped, set, cut, inserted, repeated or spliced from another seed, one
// to four changes each, drawn from a seed printed first, so that
// KVTIER_TEST_SEED replays a failure), then every file named and every
// file in a directory named (inputs libFuzzer once found; none is fine).
// Protobuf's complaints about malformed messages are silenced.
#include <google/protobuf/stubs/logging.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
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
