// SHA-256 over a sequence of byte strings, through OpenSSL's EVP interface.
#ifndef KVTIER_SERVICES_KVBLOCK_SHA256_H_
#define KVTIER_SERVICES_KVBLOCK_SHA256_H_

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace kvtier::kvblock {

using Sha256Digest = std::array<uint8_t, 32>;

// Digest of the concatenation of `parts`. Thread-safe.
Sha256Digest Sha256(std::initializer_list<std::string_view> parts);

}  // namespace kvtier::kvblock

#endif  // KVTIER_SERVICES_KVBLOCK_SHA256_H_
