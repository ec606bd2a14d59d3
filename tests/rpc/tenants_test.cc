// The tenants file: what it refuses, with a message naming the tenant, and
// a registry that keeps the last good file when a bad one replaces it.
#include "services/rpc/tenants.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/integration/test_tenants.h"
#include "tests/temp_dir.h"

namespace kvtier {
namespace {

const std::string kHash(64, 'a');

std::string OneTenant(const std::string& fields) { return "{\"tenants\": [{\"name\": \"acme\", " + fields + "}]}"; }

TEST(TenantsFile, RefusesWhatCannotBeEnforced) {
  struct Case {
    std::string json, message;
  };
  const std::string proof = "\"tokenSha256\": [\"" + kHash + "\"]";
  const std::vector<Case> bad = {
      {"not json", "not a tenants file"},
      {"{\"tenants\": [{\"role\": \"READER\"}]}", "has no name"},
      {OneTenant("\"namespaces\": [\"a\"], " + proof), "no role"},
      {OneTenant("\"role\": \"WRITER\", " + proof), "no namespaces"},
      {OneTenant("\"role\": \"WRITER\", \"namespaces\": [\"a\"]"), "no tokenSha256"},
      {OneTenant("\"role\": \"WRITER\", \"namespaces\": [\"a\"], \"tokenSha256\": [\"ABC\"]"), "64 lowercase hex"},
      {OneTenant("\"role\": \"OWNER\", \"namespaces\": [\"a\"], " + proof), "not a tenants file"},
      {"{\"tenants\": [{\"name\": \"a\", \"role\": \"ADMIN\", " + proof + "}, {\"name\": \"a\", \"role\": \"ADMIN\"}]}",
       "name listed twice"},
      // A proof of two tenants: its caller would silently be the first.
      {"{\"tenants\": [{\"name\": \"a\", \"role\": \"READER\", \"namespaces\": [\"x\"], " + proof +
           "}, {\"name\": \"b\", \"role\": \"ADMIN\", " + proof + "}]}",
       "tenants[1] (b): a token listed twice"},
      {"{\"tenants\": [{\"name\": \"a\", \"role\": \"ADMIN\", \"certificateIdentities\": [\"spiffe://x/a\"]}, "
       "{\"name\": \"b\", \"role\": \"READER\", \"namespaces\": [\"x\"], \"certificateIdentities\": "
       "[\"spiffe://x/a\"]}]}",
       "tenants[1] (b): certificate identity 'spiffe://x/a' listed twice"},
      {"{}", "no tenants in it"},
      {"{\"tenants\": []}", "no tenants in it"},
  };
  for (const Case& c : bad) {
    absl::StatusOr<v1::TenantsFile> parsed = ParseTenantsFile(c.json);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos) << c.json << ": " << parsed.status();
  }
  absl::StatusOr<v1::TenantsFile> good =
      ParseTenantsFile(OneTenant("\"role\": \"SERVICE\", \"namespaces\": [\"a\", \"b\"], " + proof));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->tenants(0).role(), v1::SERVICE);
  EXPECT_EQ(good->tenants(0).namespaces_size(), 2);
}

// docs/operations.md's quick start gives a whole tenants file: it loads,
// as written there.
TEST(OperationsDoc, QuickStartTenantsFileParses) {
  std::ifstream in(std::string(KVTIER_DOCS_DIR) + "/operations.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t start = doc.find("```json\n", doc.find("### Quick start"));
  ASSERT_NE(start, std::string::npos) << "no JSON block in the quick start";
  const size_t body = start + 8;
  const std::string json = doc.substr(body, doc.find("```", body) - body);
  absl::StatusOr<v1::TenantsFile> file = ParseTenantsFile(json);
  ASSERT_TRUE(file.ok()) << file.status() << "\n" << json;
  ASSERT_EQ(file->tenants_size(), 4);
  EXPECT_EQ(file->tenants(0).role(), v1::SERVICE);
  EXPECT_EQ(file->tenants(1).quota().device_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(file->tenants(2).certificate_identities(0), "globex");
  EXPECT_EQ(file->tenants(3).role(), v1::ADMIN);
}

// The tenants' names, as `registry`'s file lists them now.
std::vector<std::string> Names(TenantRegistry& registry) {
  std::vector<std::string> names;
  for (const auto& tenant : registry.Tenants()) names.push_back(tenant->tenant);
  return names;
}

// A tenants file's entry: `namespaces` as JSON strings ("\"a1\", \"a2\"")
// and a token whose SHA-256 is 64 times `hash`.
std::string Tenant(const std::string& name, const std::string& role, const std::string& namespaces, char hash) {
  return "{\"name\": \"" + name + "\", \"role\": \"" + role + "\", \"namespaces\": [" + namespaces +
         "], \"tokenSha256\": [\"" + std::string(64, hash) + "\"]}";
}

// A tenants file of one tenant, `name`, of `role`.
std::string OnlyTenant(const std::string& name, const std::string& role) {
  return "{\"tenants\": [" + Tenant(name, role, "\"a\"", kHash[0]) + "]}";
}

TEST(TenantRegistry, KeepsTheLastGoodFileWhenABadOneReplacesIt) {
  const testing::TempDir dir("kvtier-tenants-");
  const std::filesystem::path path = dir / "tenants.json";
  testing::WriteAtomically(path, OnlyTenant("acme", "READER"));
  absl::StatusOr<std::unique_ptr<TenantRegistry>> registry = TenantRegistry::Open(path.string(), absl::Hours(1));
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_EQ(Names(**registry), std::vector<std::string>{"acme"});
  EXPECT_EQ((*registry)->Version(), 0u);
  testing::WriteAtomically(path, "{\"tenants\": [");  // a bad edit: logged, the last good one stays
  (*registry)->ReloadIfChanged();
  EXPECT_EQ(Names(**registry), std::vector<std::string>{"acme"});
  EXPECT_EQ((*registry)->Version(), 0u) << "a refused file counted as read";
  testing::WriteAtomically(path, OnlyTenant("globex", "ADMIN"));
  (*registry)->ReloadIfChanged();
  EXPECT_EQ(Names(**registry), std::vector<std::string>{"globex"});
  // The callers of the file taken say which read they came from.
  EXPECT_EQ((*registry)->Version(), 1u);
  EXPECT_EQ((*registry)->Tenants()[0]->file_version, 1u);
  EXPECT_EQ(TenantRegistry::Open((dir / "missing").string(), absl::Hours(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The reload hook (kvtier-cache gives its store the quotas with it) runs
// once for each changed file taken, with its tenants, before calls see it,
// and for nothing else: not for an unchanged file or a refused one, not
// once it is stopped.
TEST(TenantRegistry, RunsItsHookForEachFileAReloadTakes) {
  const testing::TempDir dir("kvtier-tenants-hook-");
  const std::filesystem::path path = dir / "tenants.json";
  testing::WriteAtomically(path, OnlyTenant("acme", "READER"));
  absl::StatusOr<std::unique_ptr<TenantRegistry>> registry = TenantRegistry::Open(path.string(), absl::Hours(1));
  ASSERT_TRUE(registry.ok()) << registry.status();
  std::vector<std::vector<std::string>> seen;
  (*registry)->OnReload([&](const TenantRegistry::TenantList& tenants) {
    EXPECT_EQ(Names(**registry), std::vector<std::string>{"acme"}) << "calls saw the file before the hook";
    seen.emplace_back();
    for (const auto& tenant : tenants) seen.back().push_back(tenant->tenant + " " + v1::TenantRole_Name(tenant->role));
  });
  (*registry)->ReloadIfChanged();  // unchanged
  testing::WriteAtomically(path, "{\"tenants\": []}");
  (*registry)->ReloadIfChanged();
  EXPECT_TRUE(seen.empty());
  testing::WriteAtomically(path, OnlyTenant("globex", "WRITER"));
  (*registry)->ReloadIfChanged();
  (*registry)->ReloadIfChanged();
  EXPECT_EQ(seen, std::vector<std::vector<std::string>>{{"globex WRITER"}});
  (*registry)->OnReload(nullptr);
  testing::WriteAtomically(path, OnlyTenant("initech", "WRITER"));
  (*registry)->ReloadIfChanged();
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(Names(**registry), std::vector<std::string>{"initech"});
}

// Namespaces the same tenants may read share a reader class (and so may
// share shared-memory segments); any other tenant among their readers
// tells them apart, admins (who read everything) do not. Without a file,
// one class for all.
TEST(TenantRegistry, NamespacesReadByTheSameTenantsShareAReaderClass) {
  auto trusted = TenantRegistry::Open("", absl::Hours(1));
  ASSERT_TRUE(trusted.ok());
  EXPECT_EQ((*trusted)->ReaderClass("a"), (*trusted)->ReaderClass("b"));

  const testing::TempDir dir("kvtier-tenants-classes-");
  const std::filesystem::path path = dir / "tenants.json";
  std::ofstream(path) << "{\"tenants\": [" << Tenant("acme", "WRITER", "\"a1\", \"a2\", \"shared\"", 'a') << ", "
                      << Tenant("globex", "WRITER", "\"g1\", \"shared\"", 'b') << ", "
                      << Tenant("auditor", "READER", "\"a2\"", 'c') << ", " << Tenant("ops", "ADMIN", "", 'd') << "]}";
  auto registry = TenantRegistry::Open(path.string(), absl::Hours(1));
  ASSERT_TRUE(registry.ok()) << registry.status();
  TenantRegistry& r = **registry;
  EXPECT_NE(r.ReaderClass("a1"), r.ReaderClass("a2"));  // the auditor reads a2 only
  EXPECT_NE(r.ReaderClass("a1"), r.ReaderClass("g1"));
  EXPECT_NE(r.ReaderClass("a1"), r.ReaderClass("shared"));
  EXPECT_EQ(r.ReaderClass("g1"), r.ReaderClass("g1"));
  EXPECT_EQ(r.ReaderClass("nobody-1"), r.ReaderClass("nobody-2"));  // admins alone
  EXPECT_NE(r.ReaderClass("nobody-1"), r.ReaderClass("a1"));

  // The auditor drops a2: a1 and a2 are read by acme alone now.
  std::ofstream(dir / "new") << "{\"tenants\": [" << Tenant("acme", "WRITER", "\"a1\", \"a2\"", 'a') << ", "
                             << Tenant("auditor", "READER", "\"a3\"", 'c') << "]}";
  std::filesystem::rename(dir / "new", path);
  r.ReloadIfChanged();
  EXPECT_EQ(r.ReaderClass("a1"), r.ReaderClass("a2"));
}

// MayRead answers by the file as it is now: a right granted earlier (a
// fast path session's lease) is asked again when it is used.
TEST(TenantRegistry, MayReadFollowsTheFileAsItIsNow) {
  auto trusted = TenantRegistry::Open("", absl::Hours(1));
  ASSERT_TRUE(trusted.ok());
  EXPECT_TRUE((*trusted)->MayRead("", "anything"));

  const testing::TempDir dir("kvtier-tenants-may-read-");
  const std::filesystem::path path = dir / "tenants.json";
  const auto file = [](const std::string& acme_namespaces) {
    return "{\"tenants\": [" + Tenant("acme", "READER", acme_namespaces, 'a') + ", " + Tenant("ops", "ADMIN", "", 'b') +
           "]}";
  };
  std::ofstream(path) << file("\"a1\", \"shared\"");
  auto registry = TenantRegistry::Open(path.string(), absl::Hours(1));
  ASSERT_TRUE(registry.ok()) << registry.status();
  TenantRegistry& r = **registry;
  EXPECT_TRUE(r.MayRead("acme", "a1"));
  EXPECT_TRUE(r.MayRead("acme", "shared"));
  EXPECT_FALSE(r.MayRead("acme", "g1"));
  EXPECT_TRUE(r.MayRead("ops", "g1"));  // an admin reads every namespace
  EXPECT_FALSE(r.MayRead("globex", "a1")) << "a tenant the file does not name";

  testing::WriteAtomically(path, file("\"a1\""));
  r.ReloadIfChanged();
  EXPECT_TRUE(r.MayRead("acme", "a1"));
  EXPECT_FALSE(r.MayRead("acme", "shared")) << "a namespace taken off acme";
}

}  // namespace
}  // namespace kvtier
