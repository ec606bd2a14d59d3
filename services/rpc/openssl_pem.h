// Small helpers for reading and writing PEM with OpenSSL's BIOs, shared by
// the checks of --tls-dir's files.
#ifndef KVTIER_SERVICES_RPC_OPENSSL_PEM_H_
#define KVTIER_SERVICES_RPC_OPENSSL_PEM_H_

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

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
  void operator()(X509_STORE* store) const { X509_STORE_free(store); }
  void operator()(X509_STORE_CTX* context) const { X509_STORE_CTX_free(context); }
  void operator()(STACK_OF(X509) * certificates) const { sk_X509_free(certificates); }  // not the certificates
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

// A certificate's or list's name as DER: equal names, equal strings.
inline std::string NameDer(const X509_NAME* name) {
  unsigned char* der = nullptr;
  const int n = i2d_X509_NAME(name, &der);
  if (n <= 0) return "";
  std::string out(reinterpret_cast<char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);
  return out;
}

// The same name for people ("CN=acme client").
inline std::string NameText(const X509_NAME* name) {
  Bio out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), name, 0, XN_FLAG_RFC2253);
  return Contents(out.get());
}

// Unix seconds; 0 for no time or one that cannot be read.
inline int64_t UnixSeconds(const ASN1_TIME* time) {
  struct tm when = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &when) != 1) return 0;
  return timegm(&when);
}

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_OPENSSL_PEM_H_
