// Binding a TCP listener to a configured HOST:PORT, for the servers that run their own accept
// loop (the peer port's connection gate, /metrics).
#pragma once

#include <asio.hpp>

#include <string>

namespace starling {

// Opens, binds and listens on `listen` (HOST:PORT; port 0 picks a free one). SO_REUSEADDR is set
// (a restart may bind while old connections linger) but not SO_REUSEPORT, so an address another
// process listens on is refused. Throws starling::Error naming `setting` and the address, with
// `purpose` ("cannot <purpose> on ADDRESS") when binding fails.
void listen_on(asio::ip::tcp::acceptor& acceptor, const std::string& listen,
               const std::string& setting, const std::string& purpose);

}  // namespace starling
