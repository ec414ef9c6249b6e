// Mutual TLS from the swarm secret alone, for swarms that configure no certificates. Every node
// derives the same CA key from the secret and signs a certificate of its own with it, so a
// connection from anyone without the secret ends in the TLS handshake: no HTTP/2 frame of a
// stranger is ever parsed. gRPC 1.51 has no defence of its own against a client that floods a
// connection with streams it resets at once, or with bodies it never finishes; with this, only a
// holder of the secret can try. Traffic is also encrypted and integrity-checked, as with
// configured certificates. Which node is calling stays the business of peer/auth.h.
#pragma once

#include <string>
#include <string_view>

#include "peer/tls.h"

namespace starling {

// The CA certificate (the same bytes on every node with this secret), a fresh private key and a
// certificate for it signed by the CA. Throws starling::Error when the secret is empty.
TlsPem tls_from_secret(std::string_view swarm_secret);

}  // namespace starling
