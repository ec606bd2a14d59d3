#include "services/kvblock/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <memory>

namespace kvtier::kvblock {

Sha256Digest Sha256(std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  Sha256Digest digest{};
  unsigned int length = 0;
  bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  for (std::string_view part : parts) {
    ok = ok && EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1;
  }
  ok = ok && EVP_DigestFinal_ex(ctx.get(), digest.data(), &length) == 1;
  // Only allocation failure inside OpenSSL gets here; a wrong key would be
  // worse than stopping.
  if (!ok || length != digest.size()) std::abort();
  return digest;
}

}  // namespace kvtier::kvblock
