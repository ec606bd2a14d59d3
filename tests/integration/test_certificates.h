// Certificates made at test time with the openssl command line, laid out as
// a Kubernetes TLS Secret (ca.crt, tls.crt, tls.key in one directory), the
// layout --tls-dir reads.
#ifndef KVTIER_TESTS_INTEGRATION_TEST_CERTIFICATES_H_
#define KVTIER_TESTS_INTEGRATION_TEST_CERTIFICATES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace kvtier::testing {

// Runs a shell command; false (and a test failure) when it fails.
inline bool Shell(const std::string& command) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  EXPECT_EQ(rc, 0) << command;
  return rc == 0;
}

// The bytes of the file at `path` (a certificate, a list): "" if unreadable.
inline std::string Contents(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A certificate authority under `dir`: ca.key, ca.crt, and what `openssl
// ca` keeps (its config, index and serial), so it can issue certificates
// for any period, an expired one included.
class TestCa {
 public:
  TestCa(const std::filesystem::path& dir, const std::string& name) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "index.txt");
    std::ofstream(dir_ / "serial") << "1000\n";
    std::ofstream(dir_ / "ca.cnf") << "[ca]\ndefault_ca = test\n[test]\ndatabase = " << (dir_ / "index.txt").string()
                                   << "\nnew_certs_dir = " << dir_.string()
                                   << "\nserial = " << (dir_ / "serial").string()
                                   << "\ndefault_md = sha256\npolicy = any\nunique_subject = no\n"
                                   << "[any]\ncommonName = supplied\n";
    Shell("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj '/CN=" + name +
          "' -keyout " + (dir_ / "ca.key").string() + " -out " + (dir_ / "ca.crt").string());
  }

  // An intermediate CA: its certificate (ca.crt) signed by `parent`, so
  // what it issues chains to `parent`'s ca.crt through it.
  TestCa(const std::filesystem::path& dir, const std::string& name, const TestCa& parent) : TestCa(dir, name) {
    const std::string csr = (dir_ / "ca.csr").string(), ext = (dir_ / "ca-ext.cnf").string();
    std::ofstream(ext) << "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign, cRLSign\n";
    Shell("openssl req -new -key " + (dir_ / "ca.key").string() + " -subj '/CN=" + name + "' -out " + csr);
    parent.Sign(csr, ext, dir_ / "ca.crt", " -days 2");
  }

  // A certificate for `cn` with subject alternative names `san` (e.g.
  // "DNS:localhost,IP:127.0.0.1"), valid from `start` to `end`
  // (YYYYMMDDHHMMSSZ; empty: from now for a day), in `out` as tls.crt and
  // tls.key, with this CA's ca.crt beside them.
  void Issue(const std::filesystem::path& out, const std::string& cn, const std::string& san,
             const std::string& start = "", const std::string& end = "") const {
    std::filesystem::create_directories(out);
    const std::string key = (out / "tls.key").string(), csr = (out / "tls.csr").string();
    const std::string ext = (out / "ext.cnf").string();
    std::ofstream(ext) << "subjectAltName = " << san << "\n";
    Shell("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj '/CN=" + cn + "' -keyout " + key +
          " -out " + csr);
    Sign(csr, ext, out / "tls.crt",
         start.empty() ? std::string(" -days 1") : " -startdate " + start + " -enddate " + end);
    std::filesystem::copy_file(dir_ / "ca.crt", out / "ca.crt", std::filesystem::copy_options::overwrite_existing);
  }

  // Revokes the certificate at `certificate`, one this CA issued.
  void Revoke(const std::filesystem::path& certificate) const {
    Shell("openssl ca -config " + (dir_ / "ca.cnf").string() + " -cert " + (dir_ / "ca.crt").string() + " -keyfile " +
          (dir_ / "ca.key").string() + " -revoke " + certificate.string());
  }

  // Takes back every revocation (rewrites openssl ca's index).
  void ReinstateAll() const {
    std::ifstream in(dir_ / "index.txt");
    std::stringstream out;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("R\t", 0) == 0) {  // R, expiry, revocation date: V, expiry, none
        const size_t expiry_end = line.find('\t', 2), revoked_end = line.find('\t', expiry_end + 1);
        line = "V" + line.substr(1, expiry_end) + line.substr(revoked_end);
      }
      out << line << "\n";
    }
    in.close();
    std::ofstream(dir_ / "index.txt", std::ios::trunc) << out.str();
  }

  // This CA's revocation list of what it has revoked, issued at
  // `this_update` and due at `next_update` (Unix seconds), written to `out`.
  void WriteCrl(const std::filesystem::path& out, int64_t this_update, int64_t next_update) const {
    Shell("openssl ca -gencrl -config " + (dir_ / "ca.cnf").string() + " -cert " + (dir_ / "ca.crt").string() +
          " -keyfile " + (dir_ / "ca.key").string() + " -crl_lastupdate " + Asn1Time(this_update) +
          " -crl_nextupdate " + Asn1Time(next_update) + " -out " + out.string());
  }

  // A time as openssl takes it (-startdate, -crl_lastupdate).
  static std::string Asn1Time(int64_t unix_seconds) {
    const time_t t = static_cast<time_t>(unix_seconds);
    struct tm when;
    gmtime_r(&t, &when);
    char text[32];
    strftime(text, sizeof(text), "%Y%m%d%H%M%SZ", &when);
    return text;
  }

  // Only ca.crt in `out`: what a client that presents no certificate has.
  void TrustOnly(const std::filesystem::path& out) const {
    std::filesystem::create_directories(out);
    std::filesystem::copy_file(dir_ / "ca.crt", out / "ca.crt", std::filesystem::copy_options::overwrite_existing);
  }

 private:
  // Signs the request at `csr` with the extensions in `ext` for `period`
  // (openssl ca's flags), into `out`.
  void Sign(const std::string& csr, const std::string& ext, const std::filesystem::path& out,
            const std::string& period) const {
    Shell("openssl ca -batch -notext -config " + (dir_ / "ca.cnf").string() + " -cert " + (dir_ / "ca.crt").string() +
          " -keyfile " + (dir_ / "ca.key").string() + " -in " + csr + " -out " + out.string() + " -extfile " + ext +
          period);
  }

  std::filesystem::path dir_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_TEST_CERTIFICATES_H_
