#include "services/base/dns_srv.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

absl::StatusOr<sockaddr_in> ParseServer(const std::string& server) {
  const size_t colon = server.rfind(':');
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(server.substr(colon + 1), &port) || port < 1 || port > 65535 ||
      inet_pton(AF_INET, server.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("DNS server '", server, "' is not IPv4:PORT"));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

// Owns a resolver state for one look-up: res_n* calls on a state of their
// own are thread-safe.
class Resolver {
 public:
  Resolver() : ok_(res_ninit(&state_) == 0) {}
  ~Resolver() { res_nclose(&state_); }
  bool ok() const { return ok_; }
  res_state get() { return &state_; }

 private:
  struct __res_state state_ {};
  bool ok_;
};

}  // namespace

absl::Status ValidateDnsServer(const std::string& dns_server) {
  return dns_server.empty() ? absl::OkStatus() : ParseServer(dns_server).status();
}

absl::StatusOr<std::vector<SrvRecord>> LookUpSrv(const std::string& name, const std::string& dns_server) {
  Resolver resolver;
  if (!resolver.ok()) return absl::UnavailableError("cannot read the resolver configuration");
  res_state state = resolver.get();
  if (!dns_server.empty()) {
    absl::StatusOr<sockaddr_in> server = ParseServer(dns_server);
    if (!server.ok()) return server.status();
    state->nsaddr_list[0] = *server;
    state->nscount = 1;
  }
  state->options |= RES_USE_EDNS0;  // room for many records before falling back to TCP
  state->retrans = 1;               // seconds per try
  state->retry = 2;
  std::vector<unsigned char> answer(NS_MAXMSG);
  const int length =
      res_nsearch(state, name.c_str(), ns_c_in, ns_t_srv, answer.data(), static_cast<int>(answer.size()));
  if (length < 0) {
    const int error = state->res_h_errno;
    if (error == HOST_NOT_FOUND || error == NO_DATA) return std::vector<SrvRecord>{};
    return absl::UnavailableError(absl::StrCat("DNS SRV look-up of ", name, ": ", hstrerror(error)));
  }
  ns_msg message;
  if (ns_initparse(answer.data(), length, &message) != 0) {
    return absl::UnavailableError(absl::StrCat("DNS SRV look-up of ", name, ": an answer that does not parse"));
  }
  std::vector<SrvRecord> records;
  for (int i = 0; i < ns_msg_count(message, ns_s_an); ++i) {
    ns_rr rr;
    if (ns_parserr(&message, ns_s_an, i, &rr) != 0 || ns_rr_type(rr) != ns_t_srv || ns_rr_rdlen(rr) < 7) continue;
    const unsigned char* data = ns_rr_rdata(rr);
    SrvRecord record;
    record.priority = ns_get16(data);
    record.weight = ns_get16(data + 2);
    record.port = ns_get16(data + 4);
    char host[NS_MAXDNAME];
    if (dn_expand(ns_msg_base(message), ns_msg_end(message), data + 6, host, sizeof host) < 0) continue;
    record.host = host;
    if (!record.host.empty() && record.host.back() == '.') record.host.pop_back();
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace kvtier
