// The TCP rendezvous that carries the NCCL unique id between nodes (SGLang's flags: --dist-init-addr
// host:port, --nnodes N, --node-rank R). Node 0 listens and sends its blob to every other node, which
// connects (retrying until the deadline: node 0 may start last) and receives it. Nothing else travels here:
// NCCL's own transport does the rest. Blobs are length-prefixed; a short read or a deadline is an error.
#pragma once

#include <string>

namespace kiln::dist {

// "host:port" -> host and port; a clear error for anything else.
void parse_dist_addr(const std::string& addr, std::string* host, int* port);

// Node 0's side: bound at construction (port 0: any free port, see port()), serve() hands blob to n_peers
// connections, each within the deadline.
class RendezvousServer {
 public:
  RendezvousServer(const std::string& host, int port);
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;
  int port() const { return port_; }
  void serve(const std::string& blob, int n_peers, double timeout_s);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A peer's side: the blob node 0 serves at host:port.
std::string rendezvous_fetch(const std::string& host, int port, double timeout_s);

// Both sides in one call: node 0 serves `blob` to nnodes - 1 peers and returns it; other nodes return what
// node 0 served.
std::string exchange_blob(const std::string& addr, int nnodes, int node_rank, const std::string& blob,
                          double timeout_s);

}  // namespace kiln::dist
