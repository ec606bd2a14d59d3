// kvtier's version, as every binary reports it (--version, Stats, Info).
#ifndef KVTIER_SERVICES_BASE_VERSION_H_
#define KVTIER_SERVICES_BASE_VERSION_H_

#include <string>
#include <string_view>

namespace kvtier {

inline constexpr char kKvtierVersion[] = "0.1.0";

// "<program> <version>", as --version, Stats and Info say it.
inline std::string VersionOf(std::string_view program) { return std::string(program) + " " + kKvtierVersion; }

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_VERSION_H_
