// Small helpers for reading and writing PEM with OpenSSL's BIOs, shared by
// the checks of --tls-dir's files.
#ifndef KVTIER_SERVICES_RPC_OPENSSL_PEM_H_
#define KVTIER_SERVICES_RPC_OPENSSL_PEM_H_

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

namespace kvtier {

// An encrypted key is refused, never prompted for on a terminal.
inline int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) { return 0; }

struct OpenSslFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
  void operator()(X509* cert) const { X509_free(cert); }
  void operator()(X509_CRL* crl) const { X509_CRL_free(crl); }
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, OpenSslFree>;
using Certificate = std::unique_ptr<X509, OpenSslFree>;
using RevocationList = std::unique_ptr<X509_CRL, OpenSslFree>;
using PrivateKey = std::unique_ptr<EVP_PKEY, OpenSslFree>;

inline Bio Reading(const std::string& bytes) {
  return Bio(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

inline std::string Contents(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

// Every PEM block of one kind in `pem`, read by `read` (PEM_read_bio_X509,
// say), in order; blocks of other kinds are skipped.
template <typename T>
std::vector<std::unique_ptr<T, OpenSslFree>> PemBlocks(const std::string& pem,
                                                       T* (*read)(BIO*, T**, pem_password_cb*, void*)) {
  std::vector<std::unique_ptr<T, OpenSslFree>> blocks;
  Bio bio = Reading(pem);
  while (T* block = read(bio.get(), nullptr, NoPassphrase, nullptr)) blocks.emplace_back(block);
  ERR_clear_error();  // the end of the input reads as an error
  return blocks;
}

// Unix seconds; 0 for no time or one that cannot be read.
inline int64_t UnixSeconds(const ASN1_TIME* time) {
  struct tm when = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &when) != 1) return 0;
  return timegm(&when);
}

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_OPENSSL_PEM_H_
