// The gRPC target of a server a benchmark started, once it listens; the
// benchmark exits, saying which server, when it never does.
#ifndef KVTIER_LOAD_SERVE_TARGET_H_
#define KVTIER_LOAD_SERVE_TARGET_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "services/base/child_process.h"

namespace kvtier::load {

inline std::string ServeTarget(ChildProcess& server, const std::string& name) {
  const int port = server.WaitForListeningPort(120000);
  if (port <= 0) {
    std::fprintf(stderr, "%s did not start\n", name.c_str());
    std::exit(1);
  }
  return "127.0.0.1:" + std::to_string(port);
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_SERVE_TARGET_H_
