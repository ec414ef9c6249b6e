#include "peer/peer_config.h"

namespace starling {

std::string swarm_key_material(const PeerConfig& config) {
    if (!config.swarm_secret.empty() || !config.tls.enabled()) return config.swarm_secret;
    return trust_anchor(config.tls);
}

}  // namespace starling
