// kvtier's version, as every binary reports it (--version, Stats, Info).
#ifndef KVTIER_SERVICES_COMMON_VERSION_H_
#define KVTIER_SERVICES_COMMON_VERSION_H_

namespace kvtier {

inline constexpr char kKvtierVersion[] = "0.1.0";

}  // namespace kvtier

#endif  // KVTIER_SERVICES_COMMON_VERSION_H_
