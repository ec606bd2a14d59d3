#include "services/rpc/peer_trust.h"

#include <openssl/err.h>
#include <openssl/pem.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

// As gRPC's handshake: a CA without a list is not checked for revocation.
int IgnoreMissingList(int ok, X509_STORE_CTX* context) {
  return ok != 0 || X509_STORE_CTX_get_error(context) == X509_V_ERR_UNABLE_TO_GET_CRL ? 1 : 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PeerTrust>> PeerTrust::Make(const std::string& ca_pem,
                                                                 const std::vector<RevocationLists::List>& lists) {
  std::shared_ptr<PeerTrust> trust(new PeerTrust());
  trust->store_.reset(X509_STORE_new());
  if (trust->store_ == nullptr) return absl::ResourceExhaustedError("OpenSSL cannot make a certificate store");
  const std::vector<Certificate> cas = PemBlocks(ca_pem, PEM_read_bio_X509);
  if (cas.empty()) return absl::InvalidArgumentError("no CA certificate to trust");
  for (const Certificate& ca : cas) X509_STORE_add_cert(trust->store_.get(), ca.get());  // takes a reference
  for (const RevocationLists::List& list : lists) {
    const std::vector<RevocationList> crls = PemBlocks(list.pem, PEM_read_bio_X509_CRL);
    if (crls.size() != 1) return absl::InvalidArgumentError(absl::StrCat("cannot read the list of ", list.issuer_text));
    X509_STORE_add_crl(trust->store_.get(), crls.front().get());
    if (list.next_update != 0) trust->next_update_[list.issuer] = list.next_update;
  }
  ERR_clear_error();  // a CA given twice is an error to X509_STORE_add_cert, and harmless
  X509_STORE_set_flags(trust->store_.get(), X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
  X509_STORE_set_verify_cb(trust->store_.get(), IgnoreMissingList);
  return trust;
}

absl::StatusOr<absl::Time> PeerTrust::VerifyClient(const std::string& chain_pem) const {
  const std::vector<Certificate> presented = PemBlocks(chain_pem, PEM_read_bio_X509);
  if (presented.empty()) return absl::UnauthenticatedError("its certificate chain cannot be read");
  std::unique_ptr<STACK_OF(X509), OpenSslFree> intermediates(sk_X509_new_null());
  std::unique_ptr<X509_STORE_CTX, OpenSslFree> context(X509_STORE_CTX_new());
  if (intermediates == nullptr || context == nullptr) {
    return absl::ResourceExhaustedError("OpenSSL cannot make a verification context");
  }
  for (size_t i = 1; i < presented.size(); ++i) sk_X509_push(intermediates.get(), presented[i].get());
  if (X509_STORE_CTX_init(context.get(), store_.get(), presented.front().get(), intermediates.get()) != 1 ||
      X509_STORE_CTX_set_default(context.get(), "ssl_client") != 1) {
    ERR_clear_error();
    return absl::ResourceExhaustedError("OpenSSL cannot set up a verification");
  }
  if (X509_verify_cert(context.get()) != 1) {
    ERR_clear_error();
    const X509* failed = X509_STORE_CTX_get_current_cert(context.get());
    if (failed == nullptr) failed = presented.front().get();
    return absl::UnauthenticatedError(
        absl::StrCat("the client certificate no longer passes the TLS files in force: the certificate of ",
                     NameText(X509_get_subject_name(failed)), ": ",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(context.get()))));
  }
  // Each certificate of the chain, its CA's (self-signed) last, is trusted
  // until it expires and, when a list checks it, until that list falls due.
  int64_t until = std::numeric_limits<int64_t>::max();
  STACK_OF(X509)* chain = X509_STORE_CTX_get0_chain(context.get());
  for (int i = 0; i < sk_X509_num(chain); ++i) {
    const X509* certificate = sk_X509_value(chain, i);
    until = std::min(until, UnixSeconds(X509_get0_notAfter(certificate)));
    auto list = next_update_.find(NameDer(X509_get_issuer_name(certificate)));
    if (list != next_update_.end()) until = std::min(until, list->second);
  }
  return absl::FromUnixSeconds(until);
}

}  // namespace kvtier
