// Asks a server's reflection service to list its services, through a raw
// bidi stream (reflection's protos are not installed for C++ clients on
// Debian).
#ifndef KVTIER_TESTS_INTEGRATION_LIST_SERVICES_H_
#define KVTIER_TESTS_INTEGRATION_LIST_SERVICES_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace kvtier {

class ListServices : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ListServices(grpc::GenericStub& stub) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stub.PrepareBidiStreamingCall(&context_, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                  grpc::StubOptions(), this);
    grpc::Slice list(std::string("\x3a\x00", 2));  // field 7 list_services = ""
    request_ = grpc::ByteBuffer(&list, 1);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    std::vector<grpc::Slice> slices;
    (void)response_.Dump(&slices);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : slices) text_.append(reinterpret_cast<const char*>(s.begin()), s.size());
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    cv_.notify_all();
  }
  // The answer's bytes (the service names appear in them as text).
  std::string Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return text_;
  }
  // How the call ended; after Wait.
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_, response_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  grpc::Status status_;
  std::string text_;
};

}  // namespace kvtier

#endif  // KVTIER_TESTS_INTEGRATION_LIST_SERVICES_H_
