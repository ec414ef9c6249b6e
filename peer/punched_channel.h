// A gRPC channel over a punched connection (peer/hole_punch.h), for the side that opens the
// exchange. gRPC's channels put TLS only on connections they dial themselves, so this one dials a
// loopback listener of its own, and a thread splices the connection it accepts onto the punched
// one, byte for byte both ways. The TLS handshake and every call run end to end over the punched
// connection as over a dialed one; the other side hands its end to its peer port's gate
// (ConnectionGate::adopt), as if it had accepted it.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <thread>

#include "common/unique_fd.h"

namespace starling {

class PunchedChannel {
public:
    // `arguments` as for a channel to the partner's own address (its TLS name included).
    // Throws starling::Error when no loopback listener can be opened.
    PunchedChannel(UniqueFd punched, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                   const grpc::ChannelArguments& arguments);
    ~PunchedChannel();  // closes both connections
    PunchedChannel(const PunchedChannel&) = delete;
    PunchedChannel& operator=(const PunchedChannel&) = delete;

    const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

private:
    void splice();

    UniqueFd punched_;
    UniqueFd listener_;
    UniqueFd stop_;  // an eventfd: the splice ends when it is written
    std::shared_ptr<grpc::Channel> channel_;
    std::thread thread_;
};

}  // namespace starling
