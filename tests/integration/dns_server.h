// A real DNS server for tests: Debian's dnsmasq on a free loopback port,
// answering for the zone kvtier.test alone (anything else in it is
// NXDOMAIN). Its records are changed by restarting it on the same port, as
// a cluster's DNS changes its answers when pods come and go.
#ifndef KVTIER_TESTS_INTEGRATION_DNS_SERVER_H_
#define KVTIER_TESTS_INTEGRATION_DNS_SERVER_H_

#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "services/base/child_process.h"
#include "services/base/dns_srv.h"
#include "tests/eventually.h"

namespace kvtier::testing {

class DnsServer {
 public:
  DnsServer() : port_(FreeLoopbackPort()) {}

  // "IPv4:PORT", for LookUpSrv and --dns-server.
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // (Re)starts the server with, for each name (absolute, ending in '.'),
  // an SRV record per target (priority 0, weight 100); true once it
  // answers them all.
  bool Serve(const std::map<std::string, std::vector<SrvRecord>>& names) {
    if (process_ != nullptr) process_->Stop(SIGTERM);
    std::vector<std::string> argv = {"/usr/sbin/dnsmasq",
                                     "--keep-in-foreground",
                                     "--port=" + std::to_string(port_),
                                     "--listen-address=127.0.0.1",
                                     "--bind-interfaces",
                                     "--no-resolv",
                                     "--no-hosts",
                                     "--conf-file=/dev/null",
                                     "--pid-file=",
                                     "--log-facility=-",
                                     "--local=/kvtier.test/"};
    // As root it would switch to nobody, which clears the signal that ends
    // it with the test.
    if (geteuid() == 0) argv.push_back("--user=root");
    for (const auto& [name, records] : names) {
      const std::string relative = name.ends_with('.') ? name.substr(0, name.size() - 1) : name;
      for (const SrvRecord& r : records) {
        argv.push_back("--srv-host=" + relative + "," + r.host + "," + std::to_string(r.port) + ",0,100");
      }
    }
    process_ = std::make_unique<ChildProcess>(argv);
    // dnsmasq announces nothing on stdout: ready once it answers.
    return Eventually([&] {
      for (const auto& [name, records] : names) {
        absl::StatusOr<std::vector<SrvRecord>> got = LookUpSrv(name, address());
        if (!got.ok() || got->size() != records.size()) return false;
      }
      return true;
    });
  }

 private:
  const int port_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_DNS_SERVER_H_
